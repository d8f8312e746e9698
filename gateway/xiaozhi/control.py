"""Xiaozhi control messages from devices (``device-server/{dev}``), handled on the loop.

The edge: the device id comes from the topic (the broker's ACL lets a device publish only on its
own uplink, so the topic is authenticated); a retained message (replayed at every subscribe) is
never a live request; only the device's owner (scale-out) answers; the payload is parsed once
into a typed message. Then the session core (:mod:`sessions`) decides and the roster
(:mod:`roster`) carries out its effects. Every refusal is counted by reason and nothing raises
into the MQTT connection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gateway.mqtt.edge import Inbound
from gateway.settings import XiaozhiSettings
from gateway.xiaozhi import messages
from gateway.xiaozhi.mcp import McpClient
from gateway.xiaozhi.messages import (
    Abort,
    ControlError,
    DeviceGoodbye,
    DeviceHello,
    DeviceMcp,
    Iot,
    Listen,
    Ping,
    UdpTimeout,
)
from gateway.xiaozhi.roster import SessionEvents, SessionRoster, guarded
from gateway.xiaozhi.sessions import InSession, SessionCore, SessionOpened
from gateway.xiaozhi.stats import ChannelStats
from gateway.xiaozhi.status import Cut, StatusBook
from gateway.xiaozhi.tools import ToolsAsker
from topics.errors import TopicError
from topics.tree import parse_xiaozhi_topic, validate_template, xiaozhi_filter
from topics.xiaozhi import DeviceTaskReport

log = logging.getLogger(__name__)


class ControlHandler:
    def __init__(
        self,
        *,
        settings: XiaozhiSettings,
        core: SessionCore,
        roster: SessionRoster,
        mcp: McpClient,
        events: SessionEvents | None,
        owns: Callable[[str], bool],
        stats: ChannelStats,
        clock: Callable[[], float],
        read_audio: Callable[[], None] = lambda: None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``read_audio``: reads the uplink datagrams waiting in the socket. A goodbye, listen
        or abort travels over MQTT and may arrive while the frames the device sent before it
        still wait out the UDP read coalescing; handled first, a goodbye would close the
        session and count them as strays. (Bounded: at most 4 batches, so a flood cannot keep
        the control message waiting.) :attr:`status` is told each accepted hello's features and
        each ``tools/list`` answer (:mod:`status`; as many devices as OTA may bind); ``wall``:
        its clock (epoch seconds)."""
        self._uplink = validate_template(settings.uplink_topic)
        validate_template(settings.downlink_topic)
        self.topic_filter = xiaozhi_filter(settings.uplink_topic)
        self._core = core
        self._roster = roster
        self._mcp = mcp
        self._events = events
        self._owns = owns
        self._stats = stats
        self._clock = clock
        self._read_audio = read_audio
        self.status = StatusBook(max_devices=settings.ota_max_devices)
        self.tools = ToolsAsker(mcp=mcp, dropped=lambda: stats.status_cut.labels("asks").inc())
        self._wall = wall

    def handle(self, inbound: Inbound) -> None:  # noqa: PLR0912 - one case per message type
        """MQTT route handler (runs on the loop; never raises for bad input)."""
        stats = self._stats
        try:
            dev = parse_xiaozhi_topic(self._uplink, inbound.topic)
        except TopicError:
            stats.control_dropped.labels("bad_topic").inc()
            return
        if inbound.retain:  # replayed at every (re)subscribe: never a live request
            stats.control_dropped.labels("retained").inc()
            return
        if not self._owns(dev):
            stats.control_dropped.labels("not_owner").inc()
            return
        try:
            msg = messages.parse_device_message(inbound.payload)
        except ControlError as exc:
            stats.control_dropped.labels(exc.reason).inc()
            log.debug("refused control message from %s: %s", dev, exc)
            return
        stats.control_in.labels(msg.type).inc()
        core, roster = self._core, self._roster
        match msg:
            case DeviceHello():
                # No reply to a refused hello: the device times out after 10 s and may retry.
                effects = core.hello(dev, self._clock())
                roster.apply(effects, received=inbound.received_mono, hello=msg)
                if any(isinstance(e, SessionOpened) for e in effects):
                    features = msg.features.model_dump(exclude_none=True)
                    self._count_cut(self.status.hello(dev, features, self._wall()))
                    self._ask_tools(dev, features)
            case DeviceGoodbye(session_id=sid) | UdpTimeout(session_id=sid):
                # udp_timeout (firmware forks): the device gave up on UDP; end like a goodbye.
                self._read_audio()
                roster.apply(core.goodbye(dev, sid))
            case Listen() | Abort():
                self._read_audio()
                effects = core.in_session(dev, msg.session_id, self._clock())
                roster.apply(effects)
                for effect in effects:
                    if isinstance(effect, InSession):
                        self._in_session(dev, effect.session.session_id, msg)
            case DeviceMcp():
                self._device_mcp(dev, msg)
            case Ping() | Iot():
                stats.control_dropped.labels(f"ignored_{msg.type}").inc()
            case DeviceTaskReport():
                pass  # counted above (control_in by type): the gateway's clock and VAD step tasks
            case DeviceTaskReport():
                pass  # counted above (control_in by type): the gateway's clock and VAD step tasks

    def _in_session(self, dev: str, sid: str, msg: Listen | Abort) -> None:
        events = self._events
        if events is None:
            return
        if isinstance(msg, Listen):
            guarded(dev, "listen", lambda: events.listen(dev, sid, msg.state, msg.mode, msg.text))
        else:
            guarded(dev, "abort", lambda: events.abort(dev, sid, msg.reason))

    def _device_mcp(self, dev: str, msg: DeviceMcp) -> None:
        self._core.mcp(dev, msg.session_id, self._clock())
        payload = messages.mcp_payload(msg)
        cut = self.status.mcp_answer(dev, payload, self._wall())  # to the gateway or a server
        if cut is not None:
            self._count_cut(cut)
        if self._mcp.offer(dev, payload):
            return
        events = self._events
        if events is not None:
            guarded(dev, "mcp_message", lambda: events.mcp_message(dev, payload))

    def _ask_tools(self, dev: str, features: dict[str, object]) -> None:
        """The gateway asks a device for its tools when no server holds its session (a held
        hello's server asks itself) and they are not known yet (:mod:`tools`)."""
        live, known = self._roster.of(dev), self.status.get(dev)
        unknown = known is None or known.tools_at is None
        if features.get("mcp") and live is not None and live.replied and unknown:
            self.tools.want(dev)

    def _count_cut(self, cut: Cut) -> None:
        counter = self._stats.status_cut
        for what, n in (("tools", cut.tools), ("text", cut.text), ("devices", cut.devices)):
            if n:
                counter.labels(what).inc(n)
