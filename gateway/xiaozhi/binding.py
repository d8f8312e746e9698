"""Source-address binding of a UDP session: a pure core (time is an input).

The first datagram that is accepted for a session (right ssrc, fresh sequence, decrypted)
binds the session to its source address. Datagrams for that ssrc from any other address are
refused, except that a NAT rebinding is considered once the bound source has been silent for
``rebind_after_s`` (default 30 s: NAT mappings change when a device has been quiet, e.g.
between turns, not mid-sentence). The caller asks :meth:`check` *before* touching sequence
state, so a foreign sender can neither advance nor probe the replay window, and calls
:meth:`commit` only after the datagram was accepted.

A REBIND candidate must also pass the replay checks and decrypt to a frame this session's
device would send (:meth:`familiar`: a TOC byte the bound source already used, plus the codec's
``plausible_frame``), so neither a replayed capture nor a datagram sealed without the key can
move the session: without the key the payload is random bytes, and a random first byte is one
of the device's few TOC values with probability ~|tocs|/256 before the structure check.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

Address = tuple[str, int]
MAX_TOCS = 8  # an encoder uses a handful of TOC bytes (mode, bandwidth, frame size, code)


class Admission(enum.Enum):
    FIRST = "first"  # no address yet: this one may bind
    SAME = "same"  # from the bound address
    REBIND = "rebind"  # another address, bound source silent long enough: prove it first
    FOREIGN = "foreign"  # another address while the bound one is live: refuse


@dataclass(slots=True)
class AddressBinding:
    rebind_after_s: float
    address: Address | None = None
    last_seen: float = 0.0
    rebinds: int = 0
    tocs: set[int] = field(default_factory=set)  # TOC bytes of accepted frames (bounded)

    def check(self, source: Address, now: float) -> Admission:
        if self.address is None:
            return Admission.FIRST
        if source == self.address:
            return Admission.SAME
        if now - self.last_seen >= self.rebind_after_s:
            return Admission.REBIND
        return Admission.FOREIGN

    def familiar(self, payload: bytes) -> bool:
        """Whether a decrypted payload starts with a TOC byte this session's device used."""
        return bool(payload) and payload[0] in self.tocs

    def commit(self, source: Address, now: float, admission: Admission, payload: bytes) -> None:
        """Record an accepted datagram admitted by :meth:`check` (``payload``: its decrypted
        Opus frame, empty when it was not decrypted)."""
        if admission is Admission.FOREIGN:
            raise ValueError("a FOREIGN datagram cannot be committed")
        if admission is Admission.REBIND:
            self.rebinds += 1
        if payload and len(self.tocs) < MAX_TOCS:
            self.tocs.add(payload[0])
        self.address = source
        self.last_seen = max(self.last_seen, now)
