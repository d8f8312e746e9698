"""The shell side of the session core: each open session's I/O state, and the effects applied.

:class:`~gateway.xiaozhi.sessions.SessionCore` decides which sessions exist; the roster holds,
for each of them, what the shell needs to serve it (:class:`LiveSession`: crypto, source
binding, datagram budget, audio pipeline), keyed by the session's ssrc (how datagrams are
routed). It is changed only by the core's effects (:meth:`apply`): a session opened gets its
live state and the hello reply — unless the :class:`HelloGate` takes the hello (a CHAT session
bridged to a xiaozhi server: the reply waits for the server's hello and carries its audio
parameters, :meth:`answer_hello`); a session closed loses it (what the device already said still
reaches the runtime), is counted, and — when the core says so — the device gets a goodbye.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from gateway.xiaozhi import messages
from gateway.xiaozhi.live import LiveFactory, LiveSession
from gateway.xiaozhi.messages import DeviceHello
from gateway.xiaozhi.pump import AudioPump
from gateway.xiaozhi.sessions import (
    ControlRefused,
    Effect,
    InSession,
    SessionClosed,
    SessionCore,
    SessionOpened,
    StaleGoodbye,
)
from gateway.xiaozhi.stats import ChannelStats

log = logging.getLogger(__name__)

CAPTURES_LEFT = 64  # devices whose session closed during a capture-only window, kept at most
UplinkTap = Callable[[str, str, bytes], None]  # dev, session_id, an accepted frame's Opus
Publish = Callable[[str, bytes], None]  # dev, payload → the device's downlink topic


class SessionLink(Protocol):
    """What a session's listener may use to answer on the channel the session lives on."""

    def publish(self, dev: str, payload: bytes) -> None: ...

    def send_audio(self, dev: str, session_id: str, opus_packet: bytes) -> bool: ...

    def close_session(self, dev: str) -> bool: ...

    def set_listening(self, dev: str, listening: bool) -> None: ...

    def answer_hello(
        self, dev: str, session_id: str, *, sample_rate: int, frame_ms: int
    ) -> bool: ...


@runtime_checkable
class HelloGate(Protocol):
    """Session events that may answer a device's hello later than at once (CHAT)."""

    def holds_hello(self, dev: str, hello: DeviceHello) -> bool:
        """True: the reply waits for :meth:`SessionRoster.answer_hello` (or the session ends
        in a goodbye); asked before ``session_opened``."""
        ...


class SessionEvents(Protocol):
    """Control-side events for the runtime (all optional to act on)."""

    def session_opened(self, dev: str, session_id: str, channel: SessionLink) -> None: ...

    def session_closed(self, dev: str, session_id: str, reason: str) -> None: ...

    def listen(
        self, dev: str, session_id: str, state: str, mode: str | None, text: str | None
    ) -> None: ...

    def abort(self, dev: str, session_id: str, reason: str | None) -> None: ...

    def mcp_message(self, dev: str, payload: Mapping[str, Any]) -> None: ...


def guarded(dev: str, what: str, call: Callable[[], None]) -> None:
    """Run a runtime callback; its failure is logged with the device and contained."""
    try:
        call()
    except Exception:
        log.exception("%s handler failed for %s", what, dev)


class SessionRoster:
    def __init__(
        self,
        *,
        core: SessionCore,
        new_live: LiveFactory,
        pump: AudioPump,
        publish: Publish,
        stats: ChannelStats,
        udp_address: Callable[[], tuple[str, int]],  # (host, port) named in hello replies
        events: SessionEvents | None,
        uplink_tap: UplinkTap | None,
        clock: Callable[[], float],
        link: SessionLink,  # the channel, handed to ``session_opened``
    ) -> None:
        self._core = core
        self._new_live = new_live
        self._pump = pump
        self._publish = publish
        self._stats = stats
        self._udp_address = udp_address
        self._events = events
        self._tap = uplink_tap
        self._clock = clock
        self._link = link
        self._gate = events if isinstance(events, HelloGate) else None
        self._live: dict[int, LiveSession] = {}  # by ssrc: one entry per session of the core
        self.opened = asyncio.Event()  # set at every open (wakes the idle sweeper)
        # The datagram router's lookup by ssrc: the dict's own ``get`` (one C call a datagram,
        # no method of ours around it; ``_live`` is never rebound).
        self.route: Callable[[int], LiveSession | None] = self._live.get
        # A capture-only window's packets whose session closed before the window did (the
        # device left or said hello again mid-answer), until the window's close takes them or
        # the device's next window starts; the oldest go past CAPTURES_LEFT.
        self._left: OrderedDict[str, tuple[bytes, ...]] = OrderedDict()

    def take_captured(self, dev: str) -> tuple[bytes, ...] | None:
        """The device's last capture-only window's packets, once (its session's, or what a
        session that closed during the window left)."""
        live = self.of(dev)
        captured = live.pipeline.take_captured() if live is not None else None
        left = self._left.pop(dev, None)
        return captured if captured is not None else left

    def window_started(self, dev: str) -> None:
        """A new listening stretch: what an earlier window left is stale."""
        self._left.pop(dev, None)

    async def sweep_idle(self) -> None:
        """Close the sessions idle past the core's deadline (a task of the channel's)."""
        while True:
            deadline = self._core.next_deadline()
            if deadline is None:
                self.opened.clear()
                await self.opened.wait()
                continue
            delay = deadline - self._clock()
            if delay > 0:
                await asyncio.sleep(delay)
            self.apply(self._core.expire(self._clock()))

    def of(self, dev: str) -> LiveSession | None:
        session = self._core.by_dev(dev)
        return self._live.get(session.ssrc) if session is not None else None

    def is_current(self, live: LiveSession) -> bool:
        return self._live.get(live.session.ssrc) is live

    def apply(
        self,
        effects: list[Effect],
        *,
        received: float | None = None,
        hello: DeviceHello | None = None,
    ) -> None:
        """Carry out the core's effects; ``received``: when the hello arrived (monotonic), for
        the hello handling time; ``hello``: the device's hello (for the :class:`HelloGate`)."""
        for effect in effects:
            match effect:
                case SessionOpened(session=session):
                    live = self._new_live(session, listening=self._core.listening(session.dev))
                    self._opened(live, received, hello)
                case SessionClosed():
                    self._closed(effect)
                case StaleGoodbye(dev=dev, session_id=sid):
                    self._publish(dev, messages.goodbye(sid))
                case ControlRefused(reason=reason):
                    self._stats.control_dropped.labels(reason.value).inc()
                case InSession():  # handed on by the caller (it has the message)
                    pass

    def answer_hello(self, dev: str, session_id: str, *, sample_rate: int, frame_ms: int) -> bool:
        """The held hello reply of ``dev``'s session ``session_id``, with these downlink audio
        parameters; False when that session is gone."""
        live = self.of(dev)
        if live is None or live.session_id != session_id:
            return False
        self._reply(live, sample_rate=sample_rate, frame_ms=frame_ms)
        return True

    def _reply(self, live: LiveSession, *, sample_rate: int = 16_000, frame_ms: int = 60) -> None:
        live.replied = True
        live.downlink_rate, live.downlink_frame_ms = sample_rate, frame_ms
        session = live.session
        host, port = self._udp_address()
        self._publish(
            live.dev,
            messages.hello_reply(
                session_id=session.session_id,
                server=host,
                port=port,
                key=session.key,
                nonce=session.nonce,
                sample_rate=sample_rate,
                frame_ms=frame_ms,
            ),
        )

    def _holds(self, dev: str, hello: DeviceHello | None) -> bool:
        gate = self._gate
        if gate is None or hello is None:
            return False
        try:
            return gate.holds_hello(dev, hello)
        except Exception:
            log.exception("hello gate failed for %s: answered at once", dev)
            return False

    def _opened(self, live: LiveSession, received: float | None, hello: DeviceHello | None) -> None:
        session, dev = live.session, live.dev
        self._live[session.ssrc] = live
        live.pipeline.tap = self._tap  # called with the pipeline's own dev and session id
        self._stats.sessions_open.set(len(self._core))
        self.opened.set()
        if not self._holds(dev, hello):
            self._reply(live)
        self._stats.hellos.inc()
        if received is not None:
            self._stats.hello_handling_ms.observe((self._clock() - received) * 1000)
        log.info(
            "xiaozhi session %s opened for %s (ssrc %08x)", session.session_id, dev, session.ssrc
        )
        events = self._events
        if events is not None:
            link = self._link
            guarded(
                dev, "session_opened", lambda: events.session_opened(dev, session.session_id, link)
            )

    def _closed(self, closed: SessionClosed) -> None:
        session, reason = closed.session, closed.reason.value
        live = self._live.pop(session.ssrc, None)
        if live is not None:
            live.pipeline.finish()  # what the device already said still reaches the runtime
            live.pipeline.set_listening(False)  # a capture-only window's packets: kept
            if (left := live.pipeline.take_captured()) is not None:
                self._left[session.dev] = left
                while len(self._left) > CAPTURES_LEFT:
                    self._left.popitem(last=False)
            self._pump.forget(live.pipeline)
        self._stats.goodbyes.labels(closed.side, reason).inc()
        self._stats.sessions_open.set(len(self._core))
        if closed.announce:
            self._publish(session.dev, messages.goodbye(session.session_id))
        log.info("xiaozhi session %s of %s closed (%s)", session.session_id, session.dev, reason)
        events = self._events
        if events is not None:
            guarded(
                session.dev,
                "session_closed",
                lambda: events.session_closed(session.dev, session.session_id, reason),
            )
