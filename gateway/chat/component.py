"""The CHAT component: the Xiaozhi channel's session events, voice sink and uplink tap, and the
task runtime's mode listener, routed to one :class:`DeviceChat` per device.

Built with ``chat.upstream_url`` it bridges every CHAT session to that xiaozhi server; without,
the embedded engine answers. While a task owns a device its speech goes to the task runtime
(``inner``, the lesson's voice sink) and nothing reaches CHAT; back in CHAT the reverse.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

import aiohttp

from gateway.chat.auth import AuthScheme
from gateway.chat.bridge import Backoff, BridgeContext
from gateway.chat.credentials import UpstreamCredentials
from gateway.chat.cues import build_cues
from gateway.chat.device import DeviceChat
from gateway.chat.embedded import EmbeddedEngine, Transcriber
from gateway.chat.framing import Framing
from gateway.chat.metrics import ChatMetrics
from gateway.chat.ports import ChatPorts, VoiceChannel
from gateway.chat.upstream import DeviceHelloInfo, UpstreamConfig
from gateway.chat.voice import ChatState, VoiceConfig
from gateway.service import Context
from gateway.settings import ChatSettings
from gateway.tasks.ports import AnswerKeeper
from gateway.xiaozhi.messages import DeviceHello
from gateway.xiaozhi.voice_ports import VoiceSink

log = logging.getLogger(__name__)

# DeviceChat objects kept; at the cap the oldest one without a session makes room, and only
# when every one has a session open does a new device get no CHAT (logged).
MAX_DEVICES = 10_000


class ChatComponent:
    name = "chat"

    def __init__(
        self,
        *,
        ctx: Context,
        settings: ChatSettings,
        inner: VoiceSink,
        asr: Transcriber | None,
        start_task: Callable[[str], None] | None,
        keeper: AnswerKeeper | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``inner``: the task runtime's voice sink (speech while a task owns the device);
        ``asr``: the shared ASR pool (None: no ASR); ``start_task``: the voice task by device
        (None: ``chat.voice_task`` not configured); ``keeper``: the audio archive when
        ``archive.chat_turns`` is on (None: CHAT turns are not archived). The Xiaozhi channel
        itself comes with each session (:meth:`session_opened`)."""
        self._settings = settings
        self.inner = inner
        self._keeper = keeper
        self._asr = asr
        self._clock = clock
        self._start_task = start_task
        self._ops = ctx.ops
        self._credentials = UpstreamCredentials(
            data_dir=ctx.settings.data_dir,
            scheme=AuthScheme.BEARER if settings.token else AuthScheme.NONE,
            token=settings.token,
        )
        self._hellos: dict[str, DeviceHelloInfo] = {}  # held hellos, consumed at session open
        self._metrics = ChatMetrics(ctx.metrics)
        self._devices: dict[str, DeviceChat] = {}
        self._tasks: set[str] = set()  # devices a task owns (known before their DeviceChat)
        self._tg: asyncio.TaskGroup | None = None
        self._ready = asyncio.Event()
        self._ports: ChatPorts | None = None  # while running (its bridge needs the HTTP session)
        self._backoff = Backoff(settings.backoff_min_s, settings.backoff_max_s)
        self._cues = build_cues()  # ~20 ms once, before the service runs: ready with the rest

    @property
    def bridged(self) -> bool:
        return self._settings.upstream_url is not None

    async def run(self) -> None:
        s = self._settings
        # One WebSocket per bridged session: no connection-pool cap (aiohttp's default is 100).
        connector = aiohttp.TCPConnector(limit=0)
        if s.upstream_url is not None:
            await asyncio.to_thread(self._credentials.check)  # a broken file stops the start
        async with aiohttp.ClientSession(connector=connector) as http, asyncio.TaskGroup() as tg:
            self._tg = tg
            bridge = None
            if s.upstream_url is not None:
                bridge = BridgeContext(
                    config=UpstreamConfig(
                        url=s.upstream_url,
                        framing=Framing(s.framing),
                        hello_wait_s=s.connect_timeout_s,
                        audio_capacity=s.uplink_queue_frames,
                    ),
                    http=http,
                    identify=self._credentials.identity,
                    backoff=self._backoff,
                    clock=self._clock,
                    spawn=self._spawn,
                    count_drop=lambda reason: self._metrics.dropped.labels(reason).inc(),
                )
            self._ports = ChatPorts(
                alarm=self._alarm,
                metrics=self._metrics,
                clock=self._clock,
                spawn=self._spawn,
                config=VoiceConfig(
                    silence_timeout_ms=s.silence_timeout_s * 1000.0,
                    reply_timeout_ms=s.reply_timeout_s * 1000.0,
                    local_segments=bridge is None,
                    greeting=bridge is None,  # a bridged server greets on its own
                    relay_wake_word=bridge is not None,
                ),
                bridge=bridge,
                engine=None if bridge is not None else EmbeddedEngine(asr=self._asr, voice=s.voice),
                downlink_capacity=s.downlink_queue_frames,
                tts_lead_s=s.tts_lead_s,
                start_task=self._start_task,
                cues=self._cues,
            )
            self._ready.set()
            try:
                await asyncio.Event().wait()
            finally:
                self._tg = None
                self._ports = None
                self._ready.clear()
                # Their timers and downlinks stop here; none is handed out again (a hello
                # during shutdown finds no closed device), and one failing close stops no other.
                devices, self._devices = self._devices, {}
                self._metrics.sessions.set(0)
                for chat in devices.values():
                    try:
                        chat.close()
                    except Exception:
                        log.exception("closing %s's chat failed", chat.dev)

    async def wait_ready(self) -> None:
        await self._ready.wait()

    def device(self, dev: str) -> DeviceChat | None:
        return self._devices.get(dev)

    # -- HelloGate and SessionEvents (Xiaozhi channel) ----------------------------------------

    def holds_hello(self, dev: str, hello: DeviceHello) -> bool:
        """Bridged CHAT answers the device's hello once the server said its own (its audio
        parameters); a device a task owns, or the embedded engine, is answered at once — and so
        is a hello during the upstream back-off, whose goodbye follows at once (a device told
        nothing would wait out its own 10 s)."""
        if not self.bridged or self._ports is None or dev in self._tasks:
            return False
        if not self._backoff.allowed(self._clock()):
            return False
        self._hellos[dev] = DeviceHelloInfo(
            features=hello.features.model_dump(exclude_none=True),
            audio_params=hello.audio_params.model_dump(),
        )
        return True

    def session_opened(self, dev: str, session_id: str, channel: VoiceChannel) -> None:
        hello = self._hellos.pop(dev, None)
        chat = self._chat(dev, channel)
        if chat is not None:
            chat.opened(session_id, hello)
        elif hello is not None:
            channel.close_session(dev)  # its reply would never come: a goodbye instead

    def session_closed(self, dev: str, session_id: str, reason: str) -> None:
        chat = self._devices.get(dev)
        if chat is not None:
            chat.closed(session_id, reason)

    def listen(
        self, dev: str, session_id: str, state: str, mode: str | None, text: str | None
    ) -> None:
        chat = self._devices.get(dev)
        if chat is not None:
            chat.listen(state, mode, text)

    def abort(self, dev: str, session_id: str, reason: str | None) -> None:
        chat = self._devices.get(dev)
        if chat is not None:
            chat.abort(reason)

    def mcp_message(self, dev: str, payload: Mapping[str, Any]) -> None:
        chat = self._devices.get(dev)
        if chat is not None:
            chat.mcp(payload)

    # -- uplink tap and VoiceSink ------------------------------------------------------------

    def uplink(self, dev: str, session_id: str, opus: bytes) -> None:
        chat = self._devices.get(dev)
        if chat is not None:
            chat.frame(session_id, opus)

    def speech_started(self, dev: str, session_id: str, at_ms: float) -> None:
        chat = self._in_chat(dev)
        if chat is not None:
            chat.speech(started=True)
        else:
            self.inner.speech_started(dev, session_id, at_ms)

    def speech_stopped(
        self,
        dev: str,
        session_id: str,
        pcm: bytes,
        start_ms: float,
        end_ms: float,
        *,
        packets: Sequence[bytes] = (),
    ) -> None:
        chat = self._in_chat(dev)
        if chat is not None:
            chat.speech(started=False, pcm=pcm)
            if self._keeper is not None:  # archive.chat_turns: one row per turn, by its start
                self._keeper.submit(
                    device=dev,
                    instance_id=f"chat-{session_id}",
                    step_index=int(start_ms),
                    packets=packets,
                )
        else:
            self.inner.speech_stopped(dev, session_id, pcm, start_ms, end_ms, packets=packets)

    # -- ModeListener (task runtime) ------------------------------------------------------------

    def task_started(self, device: str) -> None:
        self._tasks.add(device)
        chat = self._devices.get(device)
        if chat is not None:
            chat.task_started()

    def back_to_chat(self, device: str, *, listen: bool = True) -> None:
        self._tasks.discard(device)
        chat = self._devices.get(device)
        if chat is not None:
            chat.back_to_chat(listen=listen)

    # -- internals ----------------------------------------------------------------------------

    def _in_chat(self, dev: str) -> DeviceChat | None:
        chat = self._devices.get(dev)
        if chat is None or chat.core.state is ChatState.SUSPENDED:
            return None
        return chat

    def _chat(self, dev: str, channel: VoiceChannel) -> DeviceChat | None:
        chat = self._devices.get(dev)
        if chat is not None:
            return chat
        if self._ports is None or (len(self._devices) >= MAX_DEVICES and not self._evict_idle()):
            log.error("no CHAT for %s (component not running or %d devices)", dev, MAX_DEVICES)
            return None
        chat = DeviceChat(dev, self._ports, channel, suspended=dev in self._tasks)
        self._devices[dev] = chat
        self._metrics.sessions.set(len(self._devices))
        return chat

    def _evict_idle(self) -> bool:
        """Forget the oldest device with no open session; False when every one has one."""
        for dev, chat in self._devices.items():
            if chat.idle:
                del self._devices[dev]
                chat.close()
                return True
        return False

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        if self._tg is None:
            coro.close()
            raise RuntimeError("chat component not running")
        return self._tg.create_task(_contained(coro, name), name=name)

    def _alarm(self, alarm: str, device: str, reason: str) -> None:
        self._ops.alarm(alarm, device=device, reason=reason)


async def _contained(coro: Coroutine[Any, Any, None], name: str) -> None:
    """A device task's failure is logged with its name and never ends the component."""
    try:
        await coro
    except Exception:
        log.exception("task %s failed", name)
