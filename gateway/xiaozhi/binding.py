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
``plausible_frame``), and :data:`REBIND_CONFIRM` such frames in a row must come from the new
source before it is adopted (:meth:`confirm`). Neither a replayed capture nor datagrams sealed
without the key can move the session: without the key a payload is random bytes, whose first
byte is one of the device's few TOC values with probability ~|tocs|/256 (one to four in
practice), so three in a row ~(|tocs|/256)**3 — at the 4 tries a second a new source gets, days
of flooding on average — while a device that really moved gets there in three frames.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

Address = tuple[str, int]
MAX_TOCS = 4  # an encoder uses one or two TOC bytes (mode, bandwidth, frame size, code)
REBIND_CONFIRM = 3  # plausible frames in a row from a new source before the session moves


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
    candidate: Address | None = None  # a new source proving itself (REBIND)
    confirmed: int = 0  # its plausible frames in a row

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

    def confirm(self, source: Address) -> bool:
        """A plausible frame from a REBIND ``source``: True once it sent
        :data:`REBIND_CONFIRM` in a row (another source, or :meth:`refuse`, restarts the run)."""
        if source != self.candidate:
            self.candidate, self.confirmed = source, 0
        self.confirmed += 1
        return self.confirmed >= REBIND_CONFIRM

    def refuse(self) -> None:
        """An implausible REBIND frame: the run of plausible ones starts over."""
        self.candidate, self.confirmed = None, 0

    def commit(self, source: Address, now: float, admission: Admission, payload: bytes) -> None:
        """Record an accepted datagram admitted by :meth:`check` (``payload``: its decrypted
        Opus frame, empty when it was not decrypted)."""
        if admission is Admission.FOREIGN:
            raise ValueError("a FOREIGN datagram cannot be committed")
        if admission is Admission.REBIND:
            self.rebinds += 1
            self.refuse()
        if payload and len(self.tocs) < MAX_TOCS:
            self.tocs.add(payload[0])
        self.address = source
        self.last_seen = max(self.last_seen, now)
