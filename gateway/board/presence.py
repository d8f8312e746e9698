"""Board presence: a sans-I/O tracker per device (time in, changes and alarms out).

* Online on the first sign of life: a heartbeat, a board-written ``status {"online":true}``,
  or any event/ack/report.
* Offline after ``missed_heartbeats * heartbeat_s`` without a sign of life, or at once on a
  board-written ``status {"online":false}`` (its LWT).
* Statuses written by a gateway (``by: "gateway"``) are ours: never evidence of anything.
* Flapping: ``flap_threshold`` changes within ``flap_window_s`` raise one alarm, then the
  count starts again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum

from gateway.board.model import OnlineStatus, PresenceChange


class Liveness(Enum):
    UNKNOWN = "unknown"
    ONLINE = "online"
    OFFLINE = "offline"


class Reason(Enum):
    HEARTBEAT = "heartbeat"
    STATUS = "status"
    ACTIVITY = "activity"
    MISSED_HEARTBEATS = "missed_heartbeats"
    LWT = "lwt"


@dataclass(frozen=True, slots=True)
class Flapping:
    dev: str
    changes: int
    window_s: float


PresenceEffect = PresenceChange | Flapping


class PresenceTracker:
    def __init__(
        self,
        dev: str,
        *,
        heartbeat_s: float,
        missed_heartbeats: int,
        flap_window_s: float,
        flap_threshold: int,
    ) -> None:
        self.dev = dev
        self._silence_s = heartbeat_s * missed_heartbeats
        self._flap_window_s = flap_window_s
        self._flap_threshold = flap_threshold
        self.state = Liveness.UNKNOWN
        self._last_seen: float | None = None
        # Bounded: only the last ``flap_threshold`` change times matter.
        self._changes: deque[float] = deque(maxlen=flap_threshold)

    @property
    def online(self) -> bool:
        return self.state is Liveness.ONLINE

    def on_heartbeat(self, now: float) -> list[PresenceEffect]:
        return self._seen(now, Reason.HEARTBEAT)

    def on_activity(self, now: float) -> list[PresenceEffect]:
        return self._seen(now, Reason.ACTIVITY)

    def on_status(self, status: OnlineStatus, now: float) -> list[PresenceEffect]:
        if status.by_gateway:
            return []
        if status.online:
            return self._seen(now, Reason.STATUS)
        self._last_seen = None
        return self._become(Liveness.OFFLINE, now, Reason.LWT)

    def tick(self, now: float) -> list[PresenceEffect]:
        deadline = self.next_deadline()
        if deadline is None or now < deadline:
            return []
        self._last_seen = None
        return self._become(Liveness.OFFLINE, now, Reason.MISSED_HEARTBEATS)

    def next_deadline(self) -> float | None:
        if self.state is not Liveness.ONLINE or self._last_seen is None:
            return None
        return self._last_seen + self._silence_s

    def _seen(self, now: float, reason: Reason) -> list[PresenceEffect]:
        self._last_seen = now
        return self._become(Liveness.ONLINE, now, reason)

    def _become(self, state: Liveness, now: float, reason: Reason) -> list[PresenceEffect]:
        if state is self.state:
            return []
        self.state = state
        effects: list[PresenceEffect] = [
            PresenceChange(self.dev, state is Liveness.ONLINE, reason.value, now)
        ]
        self._changes.append(now)
        if (
            len(self._changes) == self._flap_threshold
            and now - self._changes[0] <= self._flap_window_s
        ):
            effects.append(Flapping(self.dev, len(self._changes), self._flap_window_s))
            self._changes.clear()
        return effects
