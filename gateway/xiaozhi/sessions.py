"""The Xiaozhi voice-session table: a pure core (no I/O, time is an input).

One device has at most one session, and at most ``max_sessions`` devices have one. A ``hello``
always opens a fresh session with a new random
``session_id``, AES key and ssrc (replacing any session the device had: firmware re-hellos
without goodbye after 120 s of silence). ``goodbye`` closes only the session it names. Any
activity (control message, accepted datagram) moves the idle deadline; ``expire(now)`` returns
the sessions idle past ``idle_s`` and removes them. The shell sleeps until ``next_deadline()``.
"""

from __future__ import annotations

import enum
import secrets
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from codec.counter_space import UPLINK_SSRC_MASK

KEY_SIZE = 16
_NONCE = struct.Struct(">BBHIII")  # the UDP header layout (reference §5.1/§5.2)
_SESSION_ID_BYTES = 16


class CloseReason(enum.Enum):
    """Why a session ended; stable metric label values."""

    DEVICE_GOODBYE = "device_goodbye"
    GATEWAY_GOODBYE = "gateway_goodbye"
    REPLACED = "replaced"  # a new hello from the same device
    IDLE = "idle"
    SHUTDOWN = "shutdown"


def session_nonce(ssrc: int) -> bytes:
    """SPEC §4: ``01 00 0000 <ssrc:4> 00000000 00000000``."""
    return _NONCE.pack(0x01, 0, 0, ssrc, 0, 0)


@dataclass(slots=True)
class Session:
    dev: str
    session_id: str
    ssrc: int
    key: bytes
    opened_at: float
    last_activity: float
    closed: CloseReason | None = None

    @property
    def nonce(self) -> bytes:
        return session_nonce(self.ssrc)

    def deadline(self, idle_s: float) -> float:
        return self.last_activity + idle_s


@dataclass(frozen=True, slots=True)
class Opened:
    session: Session
    replaced: Session | None


@dataclass(slots=True)
class Randomness:
    """Where secrets come from; tests inject deterministic ones."""

    token: Callable[[int], bytes] = secrets.token_bytes
    ssrc: Callable[[], int] = field(default=lambda: secrets.randbits(32))


class SessionTable:
    def __init__(
        self, *, idle_s: float, max_sessions: int = 1000, rand: Randomness | None = None
    ) -> None:
        if idle_s <= 0 or max_sessions < 1:
            raise ValueError("idle_s must be positive and max_sessions at least 1")
        self.idle_s = idle_s
        self.max_sessions = max_sessions
        self._rand = rand or Randomness()
        self._by_dev: dict[str, Session] = {}
        self._by_ssrc: dict[int, Session] = {}

    def __len__(self) -> int:
        return len(self._by_dev)

    def by_dev(self, dev: str) -> Session | None:
        return self._by_dev.get(dev)

    def by_ssrc(self, ssrc: int) -> Session | None:
        return self._by_ssrc.get(ssrc)

    def current(self, dev: str, session_id: str | None) -> Session | None:
        """The device's session if ``session_id`` names it exactly, else ``None``."""
        session = self._by_dev.get(dev)
        if session is None or session_id is None or session.session_id != session_id:
            return None
        return session

    def hello(self, dev: str, now: float) -> Opened | None:
        """A fresh session for ``dev`` (replacing its own); ``None`` when ``max_sessions`` other
        devices hold one (the table is full: a device that has a session can always re-hello)."""
        if dev not in self._by_dev and len(self._by_dev) >= self.max_sessions:
            return None
        replaced = self._remove(dev, CloseReason.REPLACED)
        session = Session(
            dev=dev,
            session_id=self._rand.token(_SESSION_ID_BYTES).hex(),
            ssrc=self._fresh_ssrc(),
            key=self._rand.token(KEY_SIZE),
            opened_at=now,
            last_activity=now,
        )
        self._by_dev[dev] = session
        self._by_ssrc[session.ssrc] = session
        return Opened(session, replaced)

    def goodbye(self, dev: str, session_id: str | None, reason: CloseReason) -> Session | None:
        """Close the device's session if ``session_id`` names it; ``None`` if it does not."""
        if self.current(dev, session_id) is None:
            return None
        return self._remove(dev, reason)

    def touch(self, session: Session, now: float) -> None:
        if session.closed is None and now > session.last_activity:
            session.last_activity = now

    def expire(self, now: float) -> list[Session]:
        idle = [s for s in self._by_dev.values() if now >= s.deadline(self.idle_s)]
        for session in idle:
            self._remove(session.dev, CloseReason.IDLE)
        return idle

    def next_deadline(self) -> float | None:
        if not self._by_dev:
            return None
        return min(s.deadline(self.idle_s) for s in self._by_dev.values())

    def close_all(self) -> list[Session]:
        return [s for dev in list(self._by_dev) if (s := self._remove(dev, CloseReason.SHUTDOWN))]

    def _remove(self, dev: str, reason: CloseReason) -> Session | None:
        session = self._by_dev.pop(dev, None)
        if session is None:
            return None
        del self._by_ssrc[session.ssrc]
        session.closed = reason
        return session

    def _fresh_ssrc(self) -> int:
        # 0 is never handed out; a collision with a live session draws again. The top bit is
        # the downlink's (codec.counter_space): a reflected downlink datagram routes nowhere.
        for _ in range(64):
            ssrc = self._rand.ssrc() & UPLINK_SSRC_MASK
            if ssrc and ssrc not in self._by_ssrc:
                return ssrc
        raise RuntimeError("could not draw a free ssrc in 64 attempts")
