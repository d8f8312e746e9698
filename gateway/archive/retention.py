"""What the archive erases, and when (pure: the time and the rows are inputs).

* Retention: an answer archived ``retention_days`` ago or earlier is erased by the sweeper.
* Per-device quota: past ``quota_bytes`` a device's oldest answers are erased first, so the
  newest (what a parent or teacher most likely wants to hear) stay.
"""

from __future__ import annotations

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
