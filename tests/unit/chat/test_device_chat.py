"""DeviceChat (the per-device CHAT shell) with a hand-written fake channel at the edge: the
core's effects become channel calls, the embedded turn goes out in order, a task suspends and
returns, the back-off refuses at once, the silence timer sends the device to standby."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import aiohttp

from gateway.assessment.jobs import AsrKey, OnTranscript
from gateway.chat.bridge import Backoff, BridgeContext
from gateway.chat.device import DeviceChat
from gateway.chat.embedded import EmbeddedEngine
from gateway.chat.framing import Framing
from gateway.chat.metrics import ChatMetrics
from gateway.chat.ports import ChatPorts
from gateway.chat.upstream import UpstreamConfig
from gateway.chat.voice import ChatState, VoiceConfig
from gateway.metrics import Metrics

DEV = "aa_bb_cc_dd_ee_01"
SID = "s1"


def state(chat: DeviceChat) -> ChatState:
    """Read through a call (mypy would narrow ``chat.core.state`` across calls)."""
    return chat.core.state


class FakeChannel:
    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []
        self.audio: list[bytes] = []
        self.closed = 0
        self.listening: list[bool] = []
        self.changed = asyncio.Event()
        self.chat: DeviceChat | None = None

    def publish(self, dev: str, payload: bytes) -> None:
        self.published.append(json.loads(payload))
        self.changed.set()

    def send_audio(self, dev: str, session_id: str, opus_packet: bytes) -> bool:
        self.audio.append(opus_packet)
        return True

    def close_session(self, dev: str) -> bool:
        self.closed += 1
        self.changed.set()
        if self.chat is not None and self.chat.session_id is not None:
            self.chat.closed(self.chat.session_id, "gateway_goodbye")  # what the channel reports
        return True

    def set_listening(self, dev: str, listening: bool) -> None:
        self.listening.append(listening)

    def types(self) -> list[str]:
        return [f"{m['type']}:{m.get('state', '')}" for m in self.published]

    async def until(self, condition: Any) -> None:
        async with asyncio.timeout(5):
            while not condition():
                self.changed.clear()
                await self.changed.wait()


class FakeAsr:
    def transcribe(
        self, key: AsrKey, pcm: bytes, hints: tuple[str, ...], on_text: OnTranscript
    ) -> bool:
        asyncio.get_running_loop().call_soon(on_text, "hello")
        return True


async def speak(text: str, voice: str) -> list[bytes]:
    return [b"f1", b"f2", b"f3"]


@asynccontextmanager
async def device_chat(
    *, bridged: bool = False, silence_ms: float = 60_000.0
) -> AsyncIterator[tuple[DeviceChat, FakeChannel, list[tuple[str, str, str]]]]:
    channel = FakeChannel()
    alarms: list[tuple[str, str, str]] = []
    async with aiohttp.ClientSession() as http, asyncio.TaskGroup() as tg:

        def spawn(coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
            return tg.create_task(coro, name=name)

        backoff = Backoff(60.0, 60.0)
        backoff.failed(time.monotonic())  # the upstream failed a moment ago
        ports = ChatPorts(
            alarm=lambda *a: alarms.append(a),
            metrics=ChatMetrics(Metrics()),
            clock=time.monotonic,
            spawn=spawn,
            config=VoiceConfig(silence_timeout_ms=silence_ms, local_segments=not bridged),
            bridge=BridgeContext(
                config=UpstreamConfig(url="ws://127.0.0.1:9/", framing=Framing.GATEWAY),
                http=http,
                backoff=backoff,
                clock=time.monotonic,
                spawn=spawn,
                count_drop=lambda reason: None,
            )
            if bridged
            else None,
            engine=None
            if bridged
            else EmbeddedEngine(asr=FakeAsr(), speak=speak, now=lambda: datetime(2026, 1, 1)),
        )
        chat = DeviceChat(DEV, ports, channel)
        channel.chat = chat
        try:
            yield chat, channel, alarms
        finally:
            for task in tg._tasks:
                task.cancel()


async def test_embedded_turn_goes_out_in_order_and_listens_again() -> None:
    async with device_chat() as (chat, channel, _):
        chat.opened(SID)
        assert channel.listening == [True]
        chat.listen("start", "auto", None)
        chat.speech(started=True)
        chat.speech(started=False, pcm=b"\x00\x01" * 800)
        assert state(chat) is ChatState.THINKING
        await channel.until(lambda: "tts:stop" in channel.types())
        assert channel.types() == ["stt:", "tts:start", "tts:sentence_start", "tts:stop"]
        assert channel.published[0]["text"] == "hello"
        assert channel.published[2]["text"] == "Hello! Nice to hear you."
        assert all(m["session_id"] == SID for m in channel.published)
        assert channel.audio == [b"f1", b"f2", b"f3"]
        assert state(chat) is ChatState.PROMPT_LISTEN
        assert chat.core.turn == 2


async def test_abort_while_speaking_ends_the_speech() -> None:
    async with device_chat() as (chat, channel, _):
        chat.opened(SID)
        chat.listen("start", "auto", None)
        chat.speech(started=True)
        chat.speech(started=False, pcm=b"\x00\x01" * 800)
        await channel.until(lambda: "tts:start" in channel.types())
        chat.abort(None)
        await channel.until(lambda: "tts:stop" in channel.types())
        assert state(chat) is ChatState.PROMPT_LISTEN


async def test_task_suspends_and_returns() -> None:
    async with device_chat() as (chat, channel, _):
        chat.opened(SID)
        chat.listen("start", "auto", None)
        chat.task_started()
        assert state(chat) is ChatState.SUSPENDED
        assert channel.listening == [True, False]
        chat.speech(started=True)  # ignored: a task owns the device
        assert state(chat) is ChatState.SUSPENDED
        chat.back_to_chat()
        assert state(chat) is ChatState.IDLE
        assert channel.listening == [True, False, True]


async def test_silence_timer_sends_the_device_to_standby() -> None:
    async with device_chat(silence_ms=30.0) as (chat, channel, _):
        chat.opened(SID)
        chat.listen("start", "auto", None)
        await channel.until(lambda: channel.closed == 1)
        assert state(chat) is ChatState.CLOSED
        assert chat.session_id is None


async def test_backoff_refuses_at_once_with_a_goodbye() -> None:
    async with device_chat(bridged=True) as (chat, channel, alarms):
        chat.opened(SID)  # the upstream failed a moment ago: no new attempt yet
        assert channel.closed == 1
        assert state(chat) is ChatState.CLOSED
        assert alarms == []  # the alarm was raised for the failure itself
