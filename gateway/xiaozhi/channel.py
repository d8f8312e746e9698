"""The Xiaozhi MQTT+UDP channel component: control over MQTT, audio over UDP, OTA over HTTP.

Thin shell around the pure cores (:mod:`sessions`, :mod:`binding`, :mod:`downlink`): MQTT
handlers parse and act synchronously; the UDP endpoint routes datagrams; one audio task
(:mod:`pump`) runs every open session's pipeline in turn; one task sweeps idle sessions. All of them live in the
channel's TaskGroup, owned by the service. The runtime uses :meth:`set_listening`,
:meth:`speak`, :meth:`mcp_request`, :meth:`send_stt` and :meth:`close_session`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from codec.vad import VadSegmenter
from gateway.mqtt import Publisher
from gateway.service import Context
from gateway.settings import Settings
from gateway.xiaozhi import messages
from gateway.xiaozhi.control import ControlHandler, SessionEvents
from gateway.xiaozhi.downlink import Pacing, SpeakInterrupted, SpeakResult, send_paced
from gateway.xiaozhi.live import LiveFactory, LiveSession
from gateway.xiaozhi.mcp import McpClient
from gateway.xiaozhi.ota import OtaEndpoint
from gateway.xiaozhi.ota_admin import OtaAdmin
from gateway.xiaozhi.pipeline import Frame, Segmenter, VoiceSink
from gateway.xiaozhi.provisioning import Provisioner, broker_provisioner, broker_revoker
from gateway.xiaozhi.pump import AudioPump
from gateway.xiaozhi.ratelimit import HelloLimiter
from gateway.xiaozhi.sessions import CloseReason, Session, SessionTable
from gateway.xiaozhi.stats import ChannelStats
from gateway.xiaozhi.udp import UdpEndpoint, open_socket
from topics.tree import XIAOZHI_DELIVERY, build_xiaozhi_topic

log = logging.getLogger(__name__)

_RECEIVE_BUFFER = 4 * 1024 * 1024


UplinkTap = Callable[[str, str, Frame], None]  # dev, session_id, accepted uplink frame


class NoSession(LookupError):
    def __init__(self, dev: str, detail: str = "no open Xiaozhi session") -> None:
        self.dev = dev
        super().__init__(f"{dev}: {detail}")


class XiaozhiChannel:
    name = "xiaozhi"

    def __init__(
        self,
        *,
        settings: Settings,
        voice: VoiceSink | None = None,
        events: SessionEvents | None = None,
        provision: Provisioner | None = None,  # default: broker_provisioner over data_dir
        new_segmenter: Callable[[], Segmenter] = VadSegmenter,
        clock: Callable[[], float] = time.monotonic,
        listening_by_default: bool = True,
        audio_queue_frames: int = 50,
        address_wait_s: float = 3.0,
        tts_lead_s: float = 0.2,
        udp_rate_pps: float = 40.0,
        udp_burst: int = 80,
        uplink_tap: UplinkTap | None = None,
    ) -> None:
        self._settings = settings
        self._voice = voice
        self._events = events
        self.uplink_tap = uplink_tap  # may be set after construction (CHAT is built later)
        # Scale-out (gateway.cluster): only the device's owner answers its control messages,
        # so its hello reply names the owner's UDP endpoint and the session lives there.
        self.owns: Callable[[str], bool] = lambda _dev: True
        self._provision = provision
        self._new_segmenter = new_segmenter
        self._clock = clock
        self._listening_default = listening_by_default
        self._queue_frames = audio_queue_frames
        self._address_wait_s = address_wait_s
        # `tts start` travels through the broker, audio straight over UDP, and devices discard
        # audio that arrives before `tts start` (reference §6.2): give the control a head start.
        self._tts_lead_s = tts_lead_s
        # Per-session datagram budget: 60 ms frames are ~17/s; 40/s with a burst of 80 leaves
        # room for buffered wake-word audio and jitter, and caps what a flood can cost.
        self._udp_rate = (udp_rate_pps, udp_burst)
        xz = settings.xiaozhi
        self.table = SessionTable(idle_s=xz.session_idle_s, max_sessions=xz.max_sessions)
        # Bounded per-device hello budget (4 devices remembered per session slot).
        self.hellos = HelloLimiter(
            rate=xz.hellos_per_minute / 60, burst=xz.hello_burst, capacity=4 * xz.max_sessions
        )
        self._live: dict[str, LiveSession] = {}  # by dev
        self._by_ssrc: dict[int, LiveSession] = {}
        self._listening: dict[str, bool] = {}
        self._opened = asyncio.Event()
        self._tg: asyncio.TaskGroup | None = None
        self._pacing = Pacing()
        self._mqtt: Publisher | None = None
        self._stats: ChannelStats | None = None
        self._udp: UdpEndpoint | None = None
        self._udp_ready = asyncio.Event()
        self._new_live: LiveFactory | None = None
        self._pump = AudioPump()  # decode + VAD of every session, one task (pump.py)
        self.control: ControlHandler | None = None
        self.mcp: McpClient | None = None
        self.ota: OtaEndpoint | None = None

    # -- component contract ---------------------------------------------------------------

    def attach(self, ctx: Context) -> None:
        control = self.bind(ctx.mqtt, ChannelStats(ctx.metrics))
        ctx.mqtt.route(control.topic_filter, control.handle, qos=0)
        provision = self._provision or broker_provisioner(
            data_dir=self._settings.data_dir, mqtt=self._settings.mqtt
        )
        self.ota = OtaEndpoint(
            settings=self._settings,
            provision=provision,
            revoke=broker_revoker(data_dir=self._settings.data_dir),
            stats=self.stats,
        )
        self.ota.attach(ctx.http)
        OtaAdmin(self.ota).attach(ctx.admin)
        ctx.http.add_health("xiaozhi", self._health)

    def bind(self, mqtt: Publisher, stats: ChannelStats) -> ControlHandler:
        """Wire the publisher and metrics (``attach`` does this; shell tests call it directly)."""
        self._mqtt = mqtt
        self._stats = stats
        self._new_live = LiveFactory(
            voice=self._voice,
            new_segmenter=self._new_segmenter,
            counters=stats.pipeline_counters(),
            queue_frames=self._queue_frames,
            rebind_after_s=self._settings.xiaozhi.rebind_after_s,
            rate_pps=self._udp_rate[0],
            burst=self._udp_rate[1],
            notify=self._pump.notify,
        )
        self.mcp = McpClient(
            publish=self._publish,
            session_id_of=self._session_id_of,
            count=lambda outcome: stats.mcp_requests.labels(outcome).inc(),
        )
        self.control = ControlHandler(channel=self, settings=self._settings.xiaozhi, stats=stats)
        return self.control

    def endpoint(self) -> UdpEndpoint:
        """The channel's datagram protocol (``run`` binds it to a socket)."""
        return UdpEndpoint(
            lookup=self.route,
            on_activity=lambda live, now: self.table.touch(live.session, now),
            stats=self.stats,
            clock=self._clock,
        )

    def use_udp(self, udp: UdpEndpoint) -> None:
        """Serve audio through ``udp`` (connected to a transport); hellos are answered from now."""
        self._udp = udp
        self._udp_ready.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        udp = self.endpoint()
        sock = open_socket(self._settings.udp.host, self._settings.udp.port)
        try:
            await loop.create_datagram_endpoint(lambda: udp, sock=sock)
        except BaseException:
            sock.close()
            raise
        udp.drain_from(sock)
        self.use_udp(udp)
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                tg.create_task(self._pump.run(), name="xiaozhi.audio")
                tg.create_task(self._sweep_idle(), name="xiaozhi.idle-sweeper")
        finally:
            self._tg = None
            for session in self.table.close_all():
                self._teardown(session, "gateway", announce=False)
            udp.close()
            if self.ota is not None:
                self.ota.close()

    async def wait_ready(self) -> None:
        await self._udp_ready.wait()

    @property
    def ready(self) -> bool:
        """The UDP endpoint is bound, so hello replies can name its port."""
        return self._udp_ready.is_set()

    @property
    def stats(self) -> ChannelStats:
        if self._stats is None:
            raise RuntimeError("channel not attached")
        return self._stats

    @property
    def udp_port(self) -> int:
        announced = self._settings.udp.public_port
        if announced is not None:
            return announced
        return self._udp.local_port if self._udp is not None else self._settings.udp.port

    @property
    def udp_host(self) -> str:
        return self._settings.udp.public_host or self._settings.udp.host

    # -- runtime API -------------------------------------------------------------------------

    def session_id(self, dev: str) -> str | None:
        live = self._live.get(dev)
        return live.session_id if live else None

    def set_listening(self, dev: str, listening: bool) -> None:
        """Whether ``dev``'s microphone audio is needed (decode + VAD) or only accounted.

        Remembered per device (also before its session exists; default: listening). Turning it
        off flushes an utterance still open, so it reaches the :class:`VoiceSink`."""
        self._listening[dev] = listening
        live = self._live.get(dev)
        if live is not None:
            live.pipeline.set_listening(listening)

    def send_stt(self, dev: str, text: str) -> None:
        """Show the user's recognised words on the device (``stt``)."""
        live = self._require(dev)
        self._publish(dev, messages.stt(live.session_id, text))

    async def mcp_request(
        self,
        dev: str,
        method: str,
        params: Mapping[str, Any] | None = None,
        *,
        timeout_s: float = 10.0,
    ) -> dict[str, Any]:
        if self.mcp is None:
            raise RuntimeError("channel not attached")
        return await self.mcp.request(dev, method, params, timeout_s=timeout_s)

    def mcp_notify(self, dev: str, method: str, params: Mapping[str, Any] | None = None) -> None:
        if self.mcp is None:
            raise RuntimeError("channel not attached")
        self.mcp.notify(dev, method, params)

    def close_session(self, dev: str) -> bool:
        """Gateway-initiated goodbye carrying the exact current ``session_id``."""
        live = self._live.get(dev)
        if live is None:
            return False
        session = self.table.goodbye(dev, live.session_id, CloseReason.GATEWAY_GOODBYE)
        if session is not None:
            self._teardown(session, "gateway", announce=True)
        return session is not None

    def send_audio(self, dev: str, session_id: str, opus_packet: bytes) -> bool:
        """One downlink Opus packet to ``dev``'s session ``session_id`` (the caller paces);
        ``False`` if that session is gone or the packet could not go out (counted)."""
        live = self._live.get(dev)
        if live is None or live.session_id != session_id or self._udp is None:
            return False
        return self._udp.send(live, opus_packet)  # header timestamps: codec.counter_space

    async def speak(self, dev: str, opus_packets: Iterable[bytes]) -> SpeakResult:
        """``tts start`` → paced downlink frames → ``tts stop``. Raises :class:`NoSession` if the
        device has no session or never sent audio (its address is unknown)."""
        live = self._require(dev)
        try:
            async with asyncio.timeout(self._address_wait_s):
                await live.address_known.wait()
        except TimeoutError:
            raise NoSession(dev, "device address unknown (no uplink datagram yet)") from None
        udp = self._udp
        if udp is None:
            raise NoSession(dev, "UDP endpoint not running")
        async with live.speaking:  # one utterance at a time per session
            self._publish(dev, messages.tts(live.session_id, "start"))
            if self._tts_lead_s > 0:
                await asyncio.sleep(self._tts_lead_s)
            try:
                result = await send_paced(
                    opus_packets,
                    pacing=self._pacing,
                    clock=self._clock,
                    send=lambda packet: udp.send(live, packet),
                    still_open=lambda: self._live.get(dev) is live,
                )
            except SpeakInterrupted:
                raise NoSession(dev, "session closed while speaking") from None
            if self._live.get(dev) is live:
                self._publish(dev, messages.tts(live.session_id, "stop"))
            return result

    # -- used by the control handler --------------------------------------------------------

    def open_session(self, dev: str, now: float) -> LiveSession | None:
        """A fresh session for ``dev``; ``None`` if the session table is full."""
        if self._new_live is None:
            raise RuntimeError("channel not attached")
        opened = self.table.hello(dev, now)
        if opened is None:
            return None
        if opened.replaced is not None:
            self._teardown(opened.replaced, "device", announce=False)
        listening = self._listening.get(dev, self._listening_default)
        live = self._new_live(opened.session, listening=listening)
        self._live[dev] = live
        self._by_ssrc[live.session.ssrc] = live
        if self.uplink_tap is not None:
            tap, sid = self.uplink_tap, live.session_id
            live.pipeline.tap = lambda frame: tap(dev, sid, frame)
        self.stats.sessions_open.set(len(self.table))
        self._opened.set()
        return live

    def device_goodbye(self, dev: str, session_id: str | None) -> bool:
        session = self.table.goodbye(dev, session_id, CloseReason.DEVICE_GOODBYE)
        if session is not None:
            self._teardown(session, "device", announce=False)
        return session is not None

    def route(self, ssrc: int) -> LiveSession | None:
        return self._by_ssrc.get(ssrc)

    def live_session(self, dev: str, session_id: str | None) -> LiveSession | None:
        live = self._live.get(dev)
        if live is None or session_id != live.session_id:
            return None
        return live

    def touch(self, live: LiveSession) -> None:
        self.table.touch(live.session, self._clock())

    def now(self) -> float:
        return self._clock()

    def publish(self, dev: str, payload: bytes) -> None:
        self._publish(dev, payload)

    @property
    def events(self) -> SessionEvents | None:
        return self._events

    # -- internals ---------------------------------------------------------------------------

    def _teardown(self, session: Session, side: str, *, announce: bool) -> None:
        live = self._by_ssrc.pop(session.ssrc, None)
        if self._live.get(session.dev) is live:
            self._live.pop(session.dev, None)
        if live is not None:
            live.pipeline.finish()  # what the device already said still reaches the runtime
            self._pump.forget(live.pipeline)
        reason = session.closed.value if session.closed else "unknown"
        self.stats.goodbyes.labels(side, reason).inc()
        self.stats.sessions_open.set(len(self.table))
        if announce:
            self._publish(session.dev, messages.goodbye(session.session_id))
        log.info("xiaozhi session %s of %s closed (%s)", session.session_id, session.dev, reason)
        if self._events is not None:
            try:
                self._events.session_closed(session.dev, session.session_id, reason)
            except Exception:
                log.exception("session_closed handler failed for %s", session.dev)

    async def _sweep_idle(self) -> None:
        while True:
            deadline = self.table.next_deadline()
            if deadline is None:
                self._opened.clear()
                await self._opened.wait()
                continue
            delay = deadline - self._clock()
            if delay > 0:
                await asyncio.sleep(delay)
            for session in self.table.expire(self._clock()):
                self._teardown(session, "gateway", announce=True)

    def _publish(self, dev: str, payload: bytes) -> None:
        if self._mqtt is None:
            raise RuntimeError("channel not attached")
        self._mqtt.publish(
            build_xiaozhi_topic(self._settings.xiaozhi.downlink_topic, dev),
            payload,
            qos=XIAOZHI_DELIVERY.qos,
            retain=XIAOZHI_DELIVERY.retain,
        )

    def _session_id_of(self, dev: str) -> str:
        live = self._live.get(dev)
        return live.session_id if live else ""

    def _require(self, dev: str) -> LiveSession:
        live = self._live.get(dev)
        if live is None:
            raise NoSession(dev)
        return live

    def _health(self) -> dict[str, object]:
        return {"ok": self._udp is not None, "sessions": len(self.table)}
