"""The Xiaozhi MQTT+UDP channel component: control over MQTT, audio over UDP, OTA over HTTP.

Built once with its collaborators; a thin shell around the pure session core (:mod:`sessions`):
the control handler (:mod:`control`) parses MQTT messages and asks the core, the roster
(:mod:`roster`) carries out its effects, the UDP endpoint (:mod:`udp`) routes datagrams; one
task (:mod:`pump`) runs every session's pipeline, one sweeps idle sessions, one asks devices for
their MCP tools (:mod:`tools`), all in the channel's TaskGroup, owned by the service. The runtime
uses :meth:`set_listening`, :meth:`speak`, :meth:`mcp_request`, :meth:`send_stt`, :meth:`close_session`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from codec.vad import VadSegmenter
from gateway.http import HttpServer
from gateway.metrics import Metrics
from gateway.mqtt.edge import Handler, Publisher
from gateway.settings import Settings
from gateway.xiaozhi import messages
from gateway.xiaozhi.control import ControlHandler
from gateway.xiaozhi.counting import CounterBatch
from gateway.xiaozhi.downlink import SpeakResult
from gateway.xiaozhi.live import LiveFactory, LiveSession
from gateway.xiaozhi.mcp import McpClient
from gateway.xiaozhi.ota.admin import serve_ota
from gateway.xiaozhi.ota.endpoint import OtaEndpoint
from gateway.xiaozhi.ota.provisioning import Provisioner
from gateway.xiaozhi.overload import DecodeAdmissionConfig, VoiceGovernor
from gateway.xiaozhi.pump import AudioPump
from gateway.xiaozhi.roster import SessionEvents, SessionRoster, UplinkTap
from gateway.xiaozhi.sessions import SessionCore
from gateway.xiaozhi.speaking import NoSession, SessionSpeaker
from gateway.xiaozhi.stats import ChannelStats
from gateway.xiaozhi.udp import COALESCE_S, UdpEndpoint
from gateway.xiaozhi.udp_socket import open_socket
from gateway.xiaozhi.voice_ports import Claim, Segmenter, VoiceSink, packets_to_keep
from topics.tree import XIAOZHI_DELIVERY, build_xiaozhi_topic


class XiaozhiMqtt(Publisher, Protocol):
    """What the channel uses of the MQTT connection (it may not be connected yet)."""

    def route(self, topic_filter: str, handler: Handler, *, qos: int = 1) -> None: ...


def everyone(_dev: str) -> bool:
    return True


class XiaozhiChannel:
    name = "xiaozhi"

    def __init__(
        self,
        *,
        settings: Settings,
        mqtt: XiaozhiMqtt,
        metrics: Metrics,
        http: HttpServer | None,  # device listener: OTA + health (None: no OTA in this process)
        admin: HttpServer | None,  # admin listener: device approvals (None: none)
        voice: VoiceSink | None = None,
        events: SessionEvents | None = None,
        uplink_tap: UplinkTap | None = None,
        # Scale-out (gateway.cluster): only the device's owner answers its control messages,
        # so its hello reply names the owner's UDP endpoint and the session lives there.
        owns: Callable[[str], bool] = everyone,
        provision: Provisioner | None = None,  # default: broker_provisioner over data_dir
        new_segmenter: Callable[[], Segmenter] = VadSegmenter,
        clock: Callable[[], float] = time.monotonic,
        listening_by_default: bool = True,
        audio_queue_frames: int = 50,
        address_wait_s: float = 3.0,
        tts_lead_s: float = 0.2,
        udp_rate_pps: float = 40.0,
        udp_burst: int = 80,
        udp_coalesce_s: float = COALESCE_S,
    ) -> None:
        self._settings = settings
        self._mqtt = mqtt
        self._clock = clock
        self._bound_port: int | None = None
        self._udp_ready = asyncio.Event()
        xz = settings.xiaozhi
        self.stats = stats = ChannelStats(metrics)
        self.core = SessionCore(
            idle_s=xz.session_idle_s,
            max_sessions=xz.max_sessions,
            hellos_per_s=xz.hellos_per_minute / 60,
            hello_burst=xz.hello_burst,
            listening_by_default=listening_by_default,
        )
        # Per-frame counts are integer adds, on the metrics at the end of each pump turn.
        counts = CounterBatch()
        self._pump = AudioPump(after_turn=counts.flush)  # decode + VAD of every session, one task
        # Per-session datagram budget: 60 ms frames are ~17/s; 40/s with a burst of 80 leaves
        # room for buffered wake-word audio and jitter, and caps what a flood can cost.
        new_live = LiveFactory(
            voice=voice,
            new_segmenter=new_segmenter,
            counters=counts.pipeline_counters(stats.pipeline_counters()),
            queue_frames=audio_queue_frames,
            rebind_after_s=xz.rebind_after_s,
            rate_pps=udp_rate_pps,
            burst=udp_burst,
            notify=self._pump.notify,
            packets_kept=packets_to_keep(settings.archive),  # the archive's, per utterance
        )
        admission = DecodeAdmissionConfig(xz.overload_lag_ms, xz.overload_interval_ms)
        self.overload = VoiceGovernor(admission, metrics)
        self._roster = SessionRoster(
            core=self.core,
            new_live=new_live,
            pump=self._pump,
            publish=self.publish,
            stats=stats,
            udp_address=lambda: (self.udp_host, self.udp_port),
            events=events,
            uplink_tap=uplink_tap,
            clock=clock,
            link=self,
        )
        self.answer_hello = self._roster.answer_hello  # a CHAT-held hello reply (roster.py)
        self.mcp = McpClient(
            publish=self.publish,
            session_id_of=lambda dev: self.session_id(dev) or "",
            count=lambda outcome: stats.mcp_requests.labels(outcome).inc(),
        )
        self.udp_endpoint = UdpEndpoint(
            lookup=self._roster.route,
            on_activity=self.core.touch,
            stats=stats,
            clock=clock,
            after_reads=self._pump.serve,  # decode in the callback that read (pump.py)
            coalesce_s=udp_coalesce_s,
        )
        self._speaker = SessionSpeaker(
            publish=self.publish,
            send=self.udp_endpoint.send,
            is_current=self._roster.is_current,
            clock=clock,
            address_wait_s=address_wait_s,
            tts_lead_s=tts_lead_s,
        )
        self.control = ControlHandler(
            settings=xz,
            core=self.core,
            roster=self._roster,
            mcp=self.mcp,
            events=events,
            owns=owns,
            stats=stats,
            clock=clock,
            read_audio=self.udp_endpoint.read_pending,
        )
        mqtt.route(self.control.topic_filter, self.control.handle, qos=0)
        self.ota: OtaEndpoint | None = None  # None: this process serves no OTA
        if http is not None:  # with the admin routes, the devices' status (control.status)
            status = self.control.status
            self.ota = serve_ota(settings, provision, status, stats=stats, http=http, admin=admin)
            http.add_health("xiaozhi", self._health)

    # -- component contract ---------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        udp = self.udp_endpoint
        sock = open_socket(self._settings.udp.host, self._settings.udp.port)
        try:
            await loop.create_datagram_endpoint(lambda: udp, sock=sock)
        except BaseException:
            sock.close()
            raise
        udp.drain_from(sock)
        self.bound()
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._pump.run(), name="xiaozhi.audio")
                tg.create_task(self._roster.sweep_idle(), name="xiaozhi.idle-sweeper")
                tg.create_task(self.control.tools.run(), name="xiaozhi.mcp-tools")
                tg.create_task(self.overload.run(), name="xiaozhi.overload")
        finally:
            self._roster.apply(self.core.stop())
            udp.close()
            if self.ota is not None:
                self.ota.close()

    def bound(self) -> None:
        """The UDP endpoint has its transport: hellos are answered from now (``run`` calls
        this; shell tests call it after connecting a fake transport)."""
        self._bound_port = self.udp_endpoint.local_port
        self.core.serving()
        self._udp_ready.set()

    async def wait_ready(self) -> None:
        await self._udp_ready.wait()

    @property
    def ready(self) -> bool:
        """The UDP endpoint is bound, so hello replies can name its port."""
        return self._udp_ready.is_set()

    @property
    def udp_port(self) -> int:
        announced = self._settings.udp.public_port
        if announced is not None:
            return announced
        return self._bound_port if self._bound_port is not None else self._settings.udp.port

    @property
    def udp_host(self) -> str:
        return self._settings.udp.public_host or self._settings.udp.host

    # -- runtime API -------------------------------------------------------------------------

    def session_id(self, dev: str) -> str | None:
        session = self.core.by_dev(dev)
        return session.session_id if session is not None else None

    def route(self, ssrc: int) -> LiveSession | None:
        """The open session's live state for a datagram's ssrc."""
        return self._roster.route(ssrc)

    def set_listening(
        self, dev: str, listening: bool, *, sheddable: bool = False, claim: Claim | None = None
    ) -> None:
        """Whether ``dev``'s microphone audio is needed (decode + VAD) or only accounted.
        Remembered per device (also before its session exists). Turning it off flushes an
        utterance still open, so it reaches the :class:`VoiceSink`. ``sheddable``: a lesson
        window, captured only under voice overload or if ``claim`` refuses (:mod:`overload`)."""
        if listening:
            self._roster.window_started(dev)
        if self.core.set_listening(dev, listening) is not None:
            live = self._roster.of(dev)
            if live is not None:
                decode = not (listening and sheddable) or self.overload.admit(claim)
                live.pipeline.set_listening(listening, decode=decode)

    def take_captured(self, dev: str) -> tuple[bytes, ...] | None:
        """The Opus packets of ``dev``'s last capture-only window, once (None: decoded)."""
        return self._roster.take_captured(dev)

    def send_stt(self, dev: str, text: str) -> None:
        """Show the user's recognised words on the device (``stt``)."""
        live = self._require(dev)
        self.publish(dev, messages.stt(live.session_id, text))

    async def mcp_request(
        self,
        dev: str,
        method: str,
        params: Mapping[str, Any] | None = None,
        *,
        timeout_s: float = 10.0,
    ) -> dict[str, Any]:
        return await self.mcp.request(dev, method, params, timeout_s=timeout_s)

    def mcp_notify(self, dev: str, method: str, params: Mapping[str, Any] | None = None) -> None:
        self.mcp.notify(dev, method, params)

    def close_session(self, dev: str) -> bool:
        """Gateway-initiated goodbye carrying the exact current ``session_id``."""
        effects = self.core.close(dev)
        self._roster.apply(effects)
        return bool(effects)

    def send_audio(self, dev: str, session_id: str, opus_packet: bytes) -> bool:
        """One downlink Opus packet to ``dev``'s session ``session_id`` (the caller paces);
        ``False`` if that session is gone or the packet could not go out (counted)."""
        live = self._roster.of(dev)
        if live is None or live.session_id != session_id:
            return False
        return self.udp_endpoint.send(live, opus_packet)  # timestamps: codec.counter_space

    async def speak(self, dev: str, opus_packets: Iterable[bytes]) -> SpeakResult:
        """``tts start`` → paced downlink frames → ``tts stop``. Raises :class:`NoSession` if the
        device has no session or never sent audio (its address is unknown)."""
        return await self._speaker.speak(self._require(dev), opus_packets)

    def publish(self, dev: str, payload: bytes) -> None:
        """A control message to ``dev`` (its downlink topic)."""
        self._mqtt.publish(
            build_xiaozhi_topic(self._settings.xiaozhi.downlink_topic, dev),
            payload,
            qos=XIAOZHI_DELIVERY.qos,
            retain=XIAOZHI_DELIVERY.retain,
        )

    # -- internals ---------------------------------------------------------------------------

    def _require(self, dev: str) -> LiveSession:
        live = self._roster.of(dev)
        if live is None:
            raise NoSession(dev)
        return live

    def _health(self) -> dict[str, object]:
        return {"ok": self.ready, "sessions": len(self.core)}
