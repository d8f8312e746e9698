"""Per-device command outbox: a sans-I/O state machine (time in, sends and outcomes out).

Delivery rules (SPEC §3 "Command delivery"):

* **One command in flight per device.** A board handles commands one at a time, and order
  matters (STOP after PLAY must not overtake it), so the next command goes out only when the
  one in flight is acked or given up. Per-device order is submit order.
* A command not acked within ``ack_timeout_s`` is resent with the **same id** (the board
  deduplicates) up to ``max_resends`` times while the board is online; then it ends ``failed``.
* While the board is offline nothing is sent; a command in flight when the board drops goes
  back to the head of the queue and is sent again (same id, fresh resend budget) when the board
  returns. Any command whose ``ttl_ms`` passes before an ack ends ``expired``.
* The outbox is bounded (``limit`` commands, in flight included). Overflow policy: the newest
  command is refused with outcome ``overflow``; queued commands are never dropped silently.
* A late ack for a queued command (sent before the board dropped) resolves it too.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum

from gateway.board.model import Ack, AckStatus, Envelope, Outcome, OutcomeKind


class Phase(Enum):
    QUEUED = "queued"
    IN_FLIGHT = "in_flight"


@dataclass(frozen=True, slots=True)
class Send:
    """Put ``envelope`` on the wire; ``sends`` counts this one (1 = first send)."""

    envelope: Envelope
    sends: int

    @property
    def resend(self) -> bool:
        return self.sends > 1


@dataclass(frozen=True, slots=True)
class Done:
    envelope: Envelope
    outcome: Outcome


Effect = Send | Done

_ACK_OUTCOME = {
    AckStatus.ACCEPTED: OutcomeKind.ACCEPTED,
    AckStatus.DUPLICATE: OutcomeKind.DUPLICATE,
    AckStatus.REJECTED: OutcomeKind.REJECTED,
    AckStatus.BUSY: OutcomeKind.BUSY,
}


@dataclass(slots=True)
class _Entry:
    envelope: Envelope
    expires_at: float
    phase: Phase = Phase.QUEUED
    sends: int = 0
    resends_left: int = 0
    ack_due: float = 0.0
    first_sent_at: float | None = None


class Outbox:
    def __init__(self, *, ack_timeout_s: float, max_resends: int, limit: int) -> None:
        self._ack_timeout_s = ack_timeout_s
        self._max_resends = max_resends
        self._limit = limit
        # Bounded by ``limit`` (checked in submit: refuse newest).
        self._entries: deque[_Entry] = deque()
        self._online = False

    @property
    def online(self) -> bool:
        return self._online

    def __len__(self) -> int:
        return len(self._entries)

    def in_flight(self) -> str | None:
        head = self._entries[0] if self._entries else None
        return head.envelope.id if head and head.phase is Phase.IN_FLIGHT else None

    def submit(self, envelope: Envelope, now: float) -> list[Effect]:
        if len(self._entries) >= self._limit:
            return [Done(envelope, _outcome(envelope, OutcomeKind.OVERFLOW, 0))]
        self._entries.append(_Entry(envelope, expires_at=now + envelope.ttl_ms / 1000))
        return self._pump(now)

    def set_online(self, online: bool, now: float) -> list[Effect]:
        if online == self._online:
            return []
        self._online = online
        if not online and self._entries and self._entries[0].phase is Phase.IN_FLIGHT:
            self._entries[0].phase = Phase.QUEUED  # resent (same id) when the board returns
        return self._pump(now)

    def on_ack(self, ack: Ack, now: float) -> list[Effect] | None:
        """Resolve the command ``ack.ref``; ``None`` if no pending command has that id."""
        for entry in self._entries:
            if entry.envelope.id == ack.ref:
                break
        else:
            return None
        self._entries.remove(entry)
        latency = None if entry.first_sent_at is None else now - entry.first_sent_at
        kind = _ACK_OUTCOME[ack.status]
        done = Done(entry.envelope, _outcome(entry.envelope, kind, entry.sends, ack.code, latency))
        return [done, *self._pump(now)]

    def tick(self, now: float) -> list[Effect]:
        """Expire, resend or give up whatever is due at ``now``."""
        effects: list[Effect] = []
        for entry in [e for e in self._entries if now >= e.expires_at]:
            self._entries.remove(entry)
            effects.append(
                Done(entry.envelope, _outcome(entry.envelope, OutcomeKind.EXPIRED, entry.sends))
            )
        head = self._entries[0] if self._entries else None
        if head is not None and head.phase is Phase.IN_FLIGHT and now >= head.ack_due:
            if head.resends_left > 0:
                head.resends_left -= 1
                effects.append(self._send(head, now))
            else:
                self._entries.popleft()
                effects.append(
                    Done(head.envelope, _outcome(head.envelope, OutcomeKind.FAILED, head.sends))
                )
        return effects + self._pump(now)

    def next_deadline(self) -> float | None:
        deadlines = [e.expires_at for e in self._entries]
        if self._entries and self._entries[0].phase is Phase.IN_FLIGHT:
            deadlines.append(self._entries[0].ack_due)
        return min(deadlines, default=None)

    def cancel_all(self) -> list[Effect]:
        effects: list[Effect] = [
            Done(e.envelope, _outcome(e.envelope, OutcomeKind.CANCELLED, e.sends))
            for e in self._entries
        ]
        self._entries.clear()
        return effects

    def _pump(self, now: float) -> list[Effect]:
        if not self._online or not self._entries:
            return []
        head = self._entries[0]
        if head.phase is Phase.IN_FLIGHT:
            return []
        head.phase = Phase.IN_FLIGHT
        head.resends_left = self._max_resends
        return [self._send(head, now)]

    def _send(self, entry: _Entry, now: float) -> Send:
        entry.sends += 1
        entry.ack_due = now + self._ack_timeout_s
        if entry.first_sent_at is None:
            entry.first_sent_at = now
        return Send(entry.envelope, entry.sends)


def _outcome(
    envelope: Envelope,
    kind: OutcomeKind,
    sends: int,
    code: str | None = None,
    latency: float | None = None,
) -> Outcome:
    return Outcome(envelope.id, envelope.name, kind, sends, code, latency)
