"""Gateway membership and device ownership (pure: statuses and clock values in, answers out).

Membership is the set of gateways whose retained ``snlpgw/v1/gw/{gw}/status`` says
``online: true`` (the broker writes ``online: false`` through the LWT when one dies). The owner
of a device is chosen by rendezvous (highest-random-weight) hashing of ``{dev}`` over the live
set: every gateway computes the same owner from the same set with no coordination, and a
gateway leaving moves only its own devices (a joining one takes only the devices it wins).

A gateway owns nothing until it is *settled*: it has seen its own fresh ``online: true``
status come back from the broker. The broker delivers the retained statuses of the others on
subscription before that echo (one connection, in order), so by then the live set is the
broker's. Losing the broker connection unsettles it (:meth:`Membership.reset`): the others will
see its LWT and take its devices, so it must stop acting for them at once.

Statuses of other gateways are applied in the order the broker delivers them (its order per
topic), not by their ``ts``: an LWT carries the time its connection was made, older than the
``online`` status that followed it. Only our own statuses are judged by ``ts`` (a retained one
from before this connection says nothing about us now).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def weight(gateway_id: str, dev: str) -> int:
    digest = hashlib.blake2b(f"{gateway_id}\x00{dev}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner_of(dev: str, members: Iterable[str]) -> str | None:
    """The member with the highest weight for ``dev`` (ties by id); None when none is live."""
    return max(members, key=lambda gw: (weight(gw, dev), gw), default=None)


class Membership:
    def __init__(self, self_id: str) -> None:
        self.self_id = self_id
        self._live: set[str] = set()
        self._since_ms = 0
        self.settled = False

    @property
    def live(self) -> frozenset[str]:
        return frozenset(self._live)

    def reset(self, now_ms: int) -> bool:
        """The broker connection is gone: own nothing until settled again (True if it was)."""
        was = self.settled
        self.settled = False
        self._live.clear()
        self._since_ms = now_ms
        return was

    def update(self, gateway_id: str, *, online: bool, ts_ms: int) -> bool:
        """Apply one status; True when ownership may have changed (settled, or live set moved
        while settled)."""
        if gateway_id == self.self_id:
            if online and not self.settled and ts_ms >= self._since_ms:
                self.settled = True
                self._live.add(gateway_id)
                return True
            return False  # our own stale copies (old LWT) say nothing about us now
        was = gateway_id in self._live
        if online:
            self._live.add(gateway_id)
        else:
            self._live.discard(gateway_id)
        return self.settled and was != online

    def owner(self, dev: str) -> str | None:
        return owner_of(dev, self._live) if self.settled else None

    def owns(self, dev: str) -> bool:
        return self.settled and self.owner(dev) == self.self_id
