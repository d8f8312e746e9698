"""Per-device command outbox: a sans-I/O state machine (time in, sends and outcomes out).

DeliveryResult rules (SPEC §3 "Command delivery"; docs/components.md's board section states them for users):

* **Pipelined, in submit order.** Up to ``window`` commands are in flight per device at once
  (sent, not yet acked): LISTEN_STOP and the next PLAY_MEDIA leave together instead of the
  second waiting a broker round trip for the first one's ack. Commands always go on the wire
  in submit order, and the in-flight commands are always the oldest ones (a prefix of the
  queue). Order at the board rests on MQTT: one publisher, one topic (``snlp/v1/{dev}/cmd``),
  one QoS (1) is delivered in publish order over the board's connection; ids plus the board's
  deduplication make every resend safe. ``window=1`` is the old one-at-a-time behaviour.
* Each command in flight has its own ack deadline: not acked within ``ack_timeout_s`` of its
  last send, it is resent with the **same id and payload** up to ``max_resends`` times while
  the board is online, then it ends ``failed`` (the others in flight are unaffected). Resends
  due at the same time go out in submit order. Each resend waits ``backoff`` times longer than
  the one before (1 = a fixed deadline).
* With ``write_confirmed`` the deadline of a send starts when the shell reports the publish
  actually left (:meth:`Outbox.written`), not when the send was decided: under overload a
  command may wait in the MQTT outbox longer than ``ack_timeout_s``, and resending it then only
  queued more copies behind it (the resend storm of ``bench/results/timer.md``).
* While the board is offline nothing is sent; commands in flight when it drops go back to the
  queue in their places (same ids, fresh resend budget) and are sent again, in order, when the
  board returns. Any command whose ``ttl_ms`` passes before an ack ends ``expired``.
* An ack resolves its own command wherever it is in the queue (a late ack for a command sent
  before the board dropped included); acks may arrive in any order.
* The outbox is bounded (``limit`` commands, in flight included). Overflow policy: the newest
  command is refused with outcome ``overflow``; queued commands are never dropped silently.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import Enum

from gateway.board.model import AckStatus, BoardAck, Envelope, Outcome, OutcomeKind


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


OutboxEffect = Send | Done
_UNWRITTEN = float("inf")  # an ack deadline not started: the send has not left yet

_ACK_OUTCOME = {
    AckStatus.ACCEPTED: OutcomeKind.ACCEPTED,
    AckStatus.DUPLICATE: OutcomeKind.DUPLICATE,
    AckStatus.REJECTED: OutcomeKind.REJECTED,
    AckStatus.BUSY: OutcomeKind.BUSY,
}


@dataclass(slots=True)
class _OutboxEntry:
    envelope: Envelope
    expires_at: float
    phase: Phase = Phase.QUEUED
    sends: int = 0
    resends_left: int = 0
    ack_due: float = 0.0
    first_sent_at: float | None = None


class Outbox:
    def __init__(
        self,
        *,
        ack_timeout_s: float,
        max_resends: int,
        limit: int,
        window: int = 1,
        backoff: float = 1.0,
        write_confirmed: bool = False,
    ) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        if backoff < 1.0:
            raise ValueError("backoff must be at least 1")
        self._ack_timeout_s = ack_timeout_s
        self._backoff = backoff
        self._write_confirmed = write_confirmed
        self._max_resends = max_resends
        self._limit = limit
        self._window = window
        # Bounded by ``limit`` (checked in submit: refuse newest). Submit order; the entries
        # in flight are always a prefix of it (sent front to back, re-queued all together).
        self._entries: deque[_OutboxEntry] = deque()
        self._in_flight = 0  # length of that prefix
        self._online = False

    @property
    def online(self) -> bool:
        return self._online

    def __len__(self) -> int:
        return len(self._entries)

    def in_flight(self) -> tuple[str, ...]:
        """Ids of the commands sent and not yet acked, oldest first."""
        return tuple(e.envelope.id for e in self._flying())

    def submit(self, envelope: Envelope, now: float) -> list[OutboxEffect]:
        if len(self._entries) >= self._limit:
            return [Done(envelope, _outcome(envelope, OutcomeKind.OVERFLOW, 0))]
        self._entries.append(_OutboxEntry(envelope, expires_at=now + envelope.ttl_ms / 1000))
        return self._pump(now)

    def set_online(self, online: bool, now: float) -> list[OutboxEffect]:
        if online == self._online:
            return []
        self._online = online
        if not online:  # resent (same ids, in order) when the board returns
            for entry in self._flying():
                entry.phase = Phase.QUEUED
            self._in_flight = 0
        return self._pump(now)

    def on_ack(self, ack: BoardAck, now: float) -> list[OutboxEffect] | None:
        """Resolve the command ``ack.ref``; ``None`` if no pending command has that id."""
        for entry in self._entries:
            if entry.envelope.id == ack.ref:
                break
        else:
            return None
        self._remove(entry)
        latency = None if entry.first_sent_at is None else now - entry.first_sent_at
        kind = _ACK_OUTCOME[ack.status]
        done = Done(entry.envelope, _outcome(entry.envelope, kind, entry.sends, ack.code, latency))
        return [done, *self._pump(now)]

    def tick(self, now: float) -> list[OutboxEffect]:
        """Expire, resend or give up whatever is due at ``now`` (in submit order)."""
        effects: list[OutboxEffect] = []
        for entry in list(self._entries):
            if now >= entry.expires_at:
                effects.append(self._end(entry, OutcomeKind.EXPIRED))
            elif entry.phase is Phase.IN_FLIGHT and now >= entry.ack_due:
                if entry.resends_left > 0:
                    entry.resends_left -= 1
                    effects.append(self._send(entry, now))
                else:
                    effects.append(self._end(entry, OutcomeKind.FAILED))
        return effects + self._pump(now)

    def written(self, command_id: str, sends: int, now: float) -> bool:
        """The shell wrote send number ``sends`` of ``command_id`` at ``now``: its ack deadline
        starts. ``False`` (nothing changes) for a command no longer in flight or a stale send."""
        for entry in self._flying():
            if entry.envelope.id == command_id:
                if entry.sends != sends or entry.ack_due != _UNWRITTEN:
                    return False
                entry.ack_due = now + self._ack_timeout_s * self._backoff ** (sends - 1)
                if entry.first_sent_at is None:
                    entry.first_sent_at = now
                return True
        return False

    def next_deadline(self) -> float | None:
        """The earliest ttl or ack deadline (called after every board message: no lists)."""
        if not self._entries:
            return None
        earliest = math.inf
        for i, entry in enumerate(self._entries):  # in flight first: indexes < _in_flight
            earliest = min(earliest, entry.expires_at)
            if i < self._in_flight and entry.ack_due < earliest:
                earliest = entry.ack_due
        return earliest

    def cancel_all(self) -> list[OutboxEffect]:
        effects: list[OutboxEffect] = [
            Done(e.envelope, _outcome(e.envelope, OutcomeKind.CANCELLED, e.sends))
            for e in self._entries
        ]
        self._entries.clear()
        self._in_flight = 0
        return effects

    def _flying(self) -> list[_OutboxEntry]:
        return [self._entries[i] for i in range(self._in_flight)]

    def _end(self, entry: _OutboxEntry, kind: OutcomeKind) -> Done:
        self._remove(entry)
        return Done(entry.envelope, _outcome(entry.envelope, kind, entry.sends))

    def _remove(self, entry: _OutboxEntry) -> None:
        self._entries.remove(entry)
        if entry.phase is Phase.IN_FLIGHT:
            self._in_flight -= 1

    def _pump(self, now: float) -> list[OutboxEffect]:
        """Send the oldest queued commands while the board is online and the window has room."""
        sends: list[OutboxEffect] = []
        while self._online and self._in_flight < min(self._window, len(self._entries)):
            entry = self._entries[self._in_flight]
            entry.phase = Phase.IN_FLIGHT
            entry.resends_left = self._max_resends
            self._in_flight += 1
            sends.append(self._send(entry, now))
        return sends

    def _send(self, entry: _OutboxEntry, now: float) -> Send:
        entry.sends += 1
        if self._write_confirmed:
            entry.ack_due = _UNWRITTEN  # starts in written()
        else:
            entry.ack_due = now + self._ack_timeout_s * self._backoff ** (entry.sends - 1)
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
