"""What the archive erases, and when (pure: the time and the rows are inputs).

* Retention: an answer archived ``retention_days`` ago or earlier is erased by the sweeper.
* Per-device quota: past ``quota_bytes`` a device's oldest answers are erased first, so the
  newest (what a parent or teacher most likely wants to hear) stay.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from gateway.store.records import ArchivedAudio

DAY_MS = 86_400_000


def retention_cutoff_ms(now_ms: int, retention_days: float) -> int:
    """Answers created before this (epoch ms) are past retention."""
    return now_ms - int(retention_days * DAY_MS)


def over_quota(rows_oldest_first: Sequence[ArchivedAudio], quota_bytes: int) -> list[str]:
    """The ids to erase (oldest first) so that what remains fits in ``quota_bytes``."""
    total = sum(row.size_bytes for row in rows_oldest_first)
    out: list[str] = []
    for row in rows_oldest_first:
        if total <= quota_bytes:
            break
        out.append(row.audio_id)
        total -= row.size_bytes
    return out


class QuotaLedger:
    """Each device's archived bytes as last read from the store plus what this gateway wrote
    since, so the quota check does not sum the device's rows once per answer.

    A total older than ``refresh_ms`` is not trusted (another gateway sharing the store may
    have written or erased for the device): the caller reads the store again. At most
    ``max_devices`` totals are kept (least recently used first out); an erasure drops the
    totals it touched."""

    def __init__(self, *, refresh_ms: int = 60_000, max_devices: int = 4096) -> None:
        self._refresh_ms = refresh_ms
        self._max = max_devices
        self._totals: OrderedDict[str, tuple[int, int]] = OrderedDict()  # device: (bytes, read at)

    def total(self, device: str, now_ms: int) -> int | None:
        """The device's bytes if read within ``refresh_ms``, else ``None`` (read the store)."""
        entry = self._totals.get(device)
        if entry is None or now_ms - entry[1] > self._refresh_ms:
            return None
        self._totals.move_to_end(device)
        return entry[0]

    def read(self, device: str, total: int, now_ms: int) -> None:
        """The store's sum for ``device``, read at ``now_ms``."""
        self._totals[device] = (total, now_ms)
        self._totals.move_to_end(device)
        while len(self._totals) > self._max:
            self._totals.popitem(last=False)

    def wrote(self, device: str, size: int) -> None:
        """This gateway archived ``size`` more bytes for ``device`` (kept only if known)."""
        entry = self._totals.get(device)
        if entry is not None:
            self._totals[device] = (entry[0] + size, entry[1])

    def forget(self, device: str | None = None) -> None:
        """Erased for ``device`` (``None``: for any device): read the store next time."""
        if device is None:
            self._totals.clear()
        else:
            self._totals.pop(device, None)
