"""Source-address binding of a UDP session: a pure core (time is an input).

The first datagram that is accepted for a session (right ssrc, fresh sequence, decrypted)
binds the session to its source address. Datagrams for that ssrc from any other address are
refused, except that a NAT rebinding is accepted once the bound source has been silent for
``rebind_after_s``. The caller asks :meth:`check` *before* touching sequence state, so a foreign
sender can neither advance nor probe the replay window, and calls :meth:`commit` only after the
datagram was accepted (a replayed capture from a new address therefore never rebinds).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

Address = tuple[str, int]


class Admission(enum.Enum):
    FIRST = "first"  # no address yet: this one may bind
    SAME = "same"  # from the bound address
    REBIND = "rebind"  # another address, bound source silent long enough
    FOREIGN = "foreign"  # another address while the bound one is live: refuse


@dataclass(slots=True)
class AddressBinding:
    rebind_after_s: float
    address: Address | None = None
    last_seen: float = 0.0
    rebinds: int = 0

    def check(self, source: Address, now: float) -> Admission:
        if self.address is None:
            return Admission.FIRST
        if source == self.address:
            return Admission.SAME
        if now - self.last_seen >= self.rebind_after_s:
            return Admission.REBIND
        return Admission.FOREIGN

    def commit(self, source: Address, now: float, admission: Admission) -> None:
        """Record an accepted datagram admitted by :meth:`check`."""
        if admission is Admission.FOREIGN:
            raise ValueError("a FOREIGN datagram cannot be committed")
        if admission is Admission.REBIND:
            self.rebinds += 1
        self.address = source
        self.last_seen = max(self.last_seen, now)
