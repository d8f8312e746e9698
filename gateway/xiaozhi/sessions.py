"""The Xiaozhi session rules: one pure core (events and ``now`` in, effects out; no I/O).

The shell (:mod:`control` parses MQTT, :mod:`udp` datagrams) calls one method per event and
carries out the effects it gets back (:mod:`roster`). Rules (reference §6, §8):

* :class:`CoreState` is ``STARTING`` until the UDP endpoint is bound (``serving``): a hello gets
  no reply before (it would name no usable port; the device retries after 10 s); ``stop``
  closes every session and refuses hellos from then on.
* ``hello``: ``hello_burst`` per device, then ``hellos_per_s`` (a refused hello gets no reply).
  A hello always opens a fresh session (new random ``session_id``, AES key and ssrc),
  replacing the device's own (firmware re-hellos without goodbye after 120 s of silence). At
  most ``max_sessions`` devices hold one; a device that has one can always renew it.
* ``goodbye`` (or ``udp_timeout``) closes only the session it names. ``listen`` / ``abort``
  for a session that does not exist are answered with a goodbye carrying their own
  ``session_id`` (a stale device returns to idle). ``mcp`` may flow with no session.
* Activity (control message, accepted datagram) moves the idle deadline; ``expire(now)``
  closes sessions idle for ``idle_s``; the shell sleeps until ``next_deadline()``.
* Whether a device's microphone is needed is remembered per device, also before it has a
  session (default: ``listening_by_default``).
"""

from __future__ import annotations

import enum
import secrets
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from codec.counter_space import UPLINK_SSRC_MASK
from gateway.xiaozhi.ratelimit import HelloLimiter

KEY_SIZE = 16
_NONCE = struct.Struct(">BBHIII")  # the UDP header layout (reference §5.1/§5.2)
_SESSION_ID_BYTES = 16


class CoreState(enum.Enum):
    STARTING = "starting"  # UDP endpoint not bound yet: hellos get no reply
    SERVING = "serving"
    STOPPED = "stopped"  # shut down: every session closed, hellos refused


class CloseReason(enum.Enum):
    """Why a session ended; stable metric label values."""

    DEVICE_GOODBYE = "device_goodbye"
    GATEWAY_GOODBYE = "gateway_goodbye"
    REPLACED = "replaced"  # a new hello from the same device
    IDLE = "idle"
    SHUTDOWN = "shutdown"


# Which side ended the session (metric label) and whether the device is told (a goodbye).
_BY_DEVICE = frozenset({CloseReason.DEVICE_GOODBYE, CloseReason.REPLACED})
_ANNOUNCED = frozenset({CloseReason.GATEWAY_GOODBYE, CloseReason.IDLE})


class ControlDrop(enum.Enum):
    """Why a control message changed nothing; stable metric label values."""

    NOT_READY = "not_ready"
    HELLO_RATE = "hello_rate"
    SESSION_CAP = "session_cap"
    STALE_GOODBYE = "stale_goodbye"
    NO_SESSION = "no_session"


def session_nonce(ssrc: int) -> bytes:
    """SPEC §4: ``01 00 0000 <ssrc:4> 00000000 00000000``."""
    return _NONCE.pack(0x01, 0, 0, ssrc, 0, 0)


@dataclass(frozen=True, slots=True)
class Session:
    dev: str
    session_id: str
    ssrc: int
    key: bytes
    opened_at: float

    @property
    def nonce(self) -> bytes:
        return session_nonce(self.ssrc)


# -- effects ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionOpened:
    """Reply to the hello with this session's UDP parameters; start its audio state."""

    session: Session


@dataclass(frozen=True, slots=True)
class SessionClosed:
    """Drop the session's audio state; tell the device (a goodbye) if ``announce``."""

    session: Session
    reason: CloseReason

    @property
    def side(self) -> str:
        return "device" if self.reason in _BY_DEVICE else "gateway"

    @property
    def announce(self) -> bool:
        return self.reason in _ANNOUNCED


@dataclass(frozen=True, slots=True)
class ControlRefused:
    """Count the refused message; nothing else happens."""

    reason: ControlDrop


@dataclass(frozen=True, slots=True)
class StaleGoodbye:
    """Answer ``dev`` with a goodbye naming its stale ``session_id`` (no session of ours)."""

    dev: str
    session_id: str | None


@dataclass(frozen=True, slots=True)
class InSession:
    """The message belongs to this open session: hand it on."""

    session: Session


Effect = SessionOpened | SessionClosed | ControlRefused | StaleGoodbye | InSession


@dataclass(slots=True)
class Randomness:
    """Where secrets come from; tests inject deterministic ones."""

    token: Callable[[int], bytes] = secrets.token_bytes
    ssrc: Callable[[], int] = field(default=lambda: secrets.randbits(32))


@dataclass(slots=True)
class _Open:
    session: Session
    last_activity: float


class SessionCore:
    def __init__(
        self,
        *,
        idle_s: float,
        max_sessions: int = 1000,
        hellos_per_s: float = 1.0,
        hello_burst: float = 10.0,
        listening_by_default: bool = True,
        rand: Randomness | None = None,
    ) -> None:
        if idle_s <= 0 or max_sessions < 1:
            raise ValueError("idle_s must be positive and max_sessions at least 1")
        self.idle_s = idle_s
        self.max_sessions = max_sessions
        # Bounded per-device hello budget (4 devices remembered per session slot).
        self.hellos = HelloLimiter(rate=hellos_per_s, burst=hello_burst, capacity=4 * max_sessions)
        self._listening_default = listening_by_default
        self._rand = rand or Randomness()
        self._state = CoreState.STARTING
        self._by_dev: dict[str, _Open] = {}
        self._by_ssrc: dict[int, _Open] = {}
        self._listening: dict[str, bool] = {}

    @property
    def state(self) -> CoreState:
        return self._state

    def __len__(self) -> int:
        return len(self._by_dev)

    def by_dev(self, dev: str) -> Session | None:
        entry = self._by_dev.get(dev)
        return entry.session if entry is not None else None

    def current(self, dev: str, session_id: str | None) -> Session | None:
        """The device's session if ``session_id`` names it exactly, else ``None``."""
        entry = self._by_dev.get(dev)
        if entry is None or session_id is None or entry.session.session_id != session_id:
            return None
        return entry.session

    # -- lifecycle ----------------------------------------------------------------------------

    def serving(self) -> None:
        """The UDP endpoint is bound: hellos are answered from now."""
        if self._state is not CoreState.STARTING:
            raise RuntimeError(f"serving() in state {self._state.name}")
        self._state = CoreState.SERVING

    def stop(self) -> list[Effect]:
        """Shut down: close every session (no goodbye sent) and refuse hellos from now."""
        self._state = CoreState.STOPPED
        return [self._close(dev, CloseReason.SHUTDOWN) for dev in list(self._by_dev)]

    # -- control messages ---------------------------------------------------------------------

    def hello(self, dev: str, now: float) -> list[Effect]:
        if self._state is not CoreState.SERVING:
            return [ControlRefused(ControlDrop.NOT_READY)]
        if not self.hellos.allow(dev, now):
            return [ControlRefused(ControlDrop.HELLO_RATE)]
        effects: list[Effect] = []
        if dev in self._by_dev:
            effects.append(self._close(dev, CloseReason.REPLACED))
        elif len(self._by_dev) >= self.max_sessions:
            return [ControlRefused(ControlDrop.SESSION_CAP)]
        session = Session(
            dev=dev,
            session_id=self._rand.token(_SESSION_ID_BYTES).hex(),
            ssrc=self._fresh_ssrc(),
            key=self._rand.token(KEY_SIZE),
            opened_at=now,
        )
        entry = _Open(session, last_activity=now)
        self._by_dev[dev] = entry
        self._by_ssrc[session.ssrc] = entry
        effects.append(SessionOpened(session))
        return effects

    def goodbye(self, dev: str, session_id: str | None) -> list[Effect]:
        """The device ends the session it names (``goodbye`` / ``udp_timeout``)."""
        if self.current(dev, session_id) is None:
            return [ControlRefused(ControlDrop.STALE_GOODBYE)]
        return [self._close(dev, CloseReason.DEVICE_GOODBYE)]

    def in_session(self, dev: str, session_id: str | None, now: float) -> list[Effect]:
        """``listen`` / ``abort``: only for the open session they name."""
        session = self.current(dev, session_id)
        if session is None:
            return [ControlRefused(ControlDrop.NO_SESSION), StaleGoodbye(dev, session_id)]
        self.touch(session, now)
        return [InSession(session)]

    def mcp(self, dev: str, session_id: str | None, now: float) -> Session | None:
        """An MCP message: the session it names (touched), or ``None`` (it flows anyway)."""
        session = self.current(dev, session_id)
        if session is not None:
            self.touch(session, now)
        return session

    # -- the gateway's side -------------------------------------------------------------------

    def close(self, dev: str) -> list[Effect]:
        """Gateway-initiated goodbye of the device's session (nothing if it has none)."""
        if dev not in self._by_dev:
            return []
        return [self._close(dev, CloseReason.GATEWAY_GOODBYE)]

    def touch(self, session: Session, now: float) -> None:
        """Activity on ``session`` (a no-op once it is closed; time never moves back)."""
        entry = self._by_ssrc.get(session.ssrc)
        if entry is not None and entry.session is session and now > entry.last_activity:
            entry.last_activity = now

    def expire(self, now: float) -> list[Effect]:
        idle = [dev for dev, e in self._by_dev.items() if now >= e.last_activity + self.idle_s]
        return [self._close(dev, CloseReason.IDLE) for dev in idle]

    def next_deadline(self) -> float | None:
        if not self._by_dev:
            return None
        return min(e.last_activity for e in self._by_dev.values()) + self.idle_s

    def set_listening(self, dev: str, listening: bool) -> Session | None:
        """Remember whether ``dev``'s microphone is needed; its open session, if any."""
        self._listening[dev] = listening
        return self.by_dev(dev)

    def listening(self, dev: str) -> bool:
        return self._listening.get(dev, self._listening_default)

    # -- internals ----------------------------------------------------------------------------

    def _close(self, dev: str, reason: CloseReason) -> SessionClosed:
        entry = self._by_dev.pop(dev)
        del self._by_ssrc[entry.session.ssrc]
        return SessionClosed(entry.session, reason)

    def _fresh_ssrc(self) -> int:
        # 0 is never handed out; a collision with a live session draws again. The top bit is
        # the downlink's (codec.counter_space): a reflected downlink datagram routes nowhere.
        for _ in range(64):
            ssrc = self._rand.ssrc() & UPLINK_SSRC_MASK
            if ssrc and ssrc not in self._by_ssrc:
                return ssrc
        raise RuntimeError("could not draw a free ssrc in 64 attempts")
