"""Xiaozhi control messages from devices (``device-server/{dev}``), handled on the loop.

The device id comes from the topic (the broker's ACL lets a device publish only on its own
uplink, so the topic is authenticated); the payload is parsed once into a typed message.
Every refusal is counted by reason and nothing raises into the MQTT connection.

Rules (reference §6, §8): ``hello`` opens a fresh session (replacing any); ``goodbye`` closes
only the session it names; ``listen`` / ``abort`` for a session that does not exist are answered
with a goodbye carrying the message's own ``session_id`` (so a stale device returns to idle);
``mcp`` may flow with no audio session (``session_id`` ``""``) and is never answered that way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from gateway.mqtt import Inbound
from gateway.settings import XiaozhiSettings
from gateway.xiaozhi import messages
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
from gateway.xiaozhi.stats import ChannelStats
from topics.errors import TopicError
from topics.tree import parse_xiaozhi_topic, validate_template, xiaozhi_filter

if TYPE_CHECKING:
    from gateway.xiaozhi.channel import XiaozhiChannel

log = logging.getLogger(__name__)


class SessionEvents(Protocol):
    """Control-side events for the runtime (all optional to act on)."""

    def session_opened(self, dev: str, session_id: str) -> None: ...

    def session_closed(self, dev: str, session_id: str, reason: str) -> None: ...

    def listen(
        self, dev: str, session_id: str, state: str, mode: str | None, text: str | None
    ) -> None: ...

    def abort(self, dev: str, session_id: str, reason: str | None) -> None: ...

    def mcp_message(self, dev: str, payload: Mapping[str, Any]) -> None: ...


class ControlHandler:
    def __init__(
        self, *, channel: XiaozhiChannel, settings: XiaozhiSettings, stats: ChannelStats
    ) -> None:
        self._channel = channel
        self._uplink = validate_template(settings.uplink_topic)
        validate_template(settings.downlink_topic)
        self._stats = stats
        self.topic_filter = xiaozhi_filter(settings.uplink_topic)

    def handle(self, inbound: Inbound) -> None:
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
        if not self._channel.owns(dev):
            stats.control_dropped.labels("not_owner").inc()
            return
        try:
            msg = messages.parse_device_message(inbound.payload)
        except ControlError as exc:
            stats.control_dropped.labels(exc.reason).inc()
            log.debug("refused control message from %s: %s", dev, exc)
            return
        stats.control_in.labels(msg.type).inc()
        match msg:
            case DeviceHello():
                self._hello(dev, inbound)
            case DeviceGoodbye(session_id=sid) | UdpTimeout(session_id=sid):
                # udp_timeout (firmware forks): the device gave up on UDP; end like a goodbye.
                if not self._channel.device_goodbye(dev, sid):
                    stats.control_dropped.labels("stale_goodbye").inc()
            case Listen() | Abort():
                self._in_session(dev, msg)
            case DeviceMcp():
                self._mcp(dev, msg)
            case Ping() | Iot():
                stats.control_dropped.labels(f"ignored_{msg.type}").inc()

    def _hello(self, dev: str, inbound: Inbound) -> None:
        channel = self._channel
        if not channel.ready:
            # The UDP port is not bound yet (start-up race): a reply would name no usable port.
            # No reply: the device times out after 10 s and says hello again.
            self._stats.control_dropped.labels("not_ready").inc()
            return
        now = channel.now()
        # No reply to a refused hello: the device times out after 10 s and may try again.
        if not channel.hellos.allow(dev, now):
            self._stats.control_dropped.labels("hello_rate").inc()
            return
        live = channel.open_session(dev, now)
        if live is None:
            self._stats.control_dropped.labels("session_cap").inc()
            log.debug("hello from %s refused: %d sessions open", dev, len(channel.table))
            return
        session = live.session
        channel.publish(
            dev,
            messages.hello_reply(
                session_id=session.session_id,
                server=channel.udp_host,
                port=channel.udp_port,
                key=session.key,
                nonce=session.nonce,
            ),
        )
        self._stats.hellos.inc()
        self._stats.hello_handling_ms.observe((channel.now() - inbound.received_mono) * 1000)
        log.info(
            "xiaozhi session %s opened for %s (ssrc %08x)", session.session_id, dev, session.ssrc
        )
        events = channel.events
        if events is not None:
            _guard(dev, "session_opened", lambda: events.session_opened(dev, session.session_id))

    def _in_session(self, dev: str, msg: Listen | Abort) -> None:
        channel = self._channel
        live = channel.live_session(dev, msg.session_id)
        if live is None:
            self._stats.control_dropped.labels("no_session").inc()
            channel.publish(dev, messages.goodbye(msg.session_id))
            return
        channel.touch(live)
        events = channel.events
        if events is None:
            return
        sid = live.session_id
        if isinstance(msg, Listen):
            _guard(dev, "listen", lambda: events.listen(dev, sid, msg.state, msg.mode, msg.text))
        else:
            _guard(dev, "abort", lambda: events.abort(dev, sid, msg.reason))

    def _mcp(self, dev: str, msg: DeviceMcp) -> None:
        channel = self._channel
        live = channel.live_session(dev, msg.session_id)
        if live is not None:
            channel.touch(live)
        payload = messages.mcp_payload(msg)
        if channel.mcp is not None and channel.mcp.offer(dev, payload):
            return
        events = channel.events
        if events is not None:
            _guard(dev, "mcp_message", lambda: events.mcp_message(dev, payload))


def _guard(dev: str, what: str, call: Callable[[], None]) -> None:
    try:
        call()
    except Exception:
        log.exception("%s handler failed for %s", what, dev)
