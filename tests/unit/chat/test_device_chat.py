"""DeviceChat (the per-device CHAT shell) with a hand-written fake channel at the edge: the
core's effects become channel calls, the embedded turn goes out in order, a task suspends and
returns, the back-off refuses at once, the silence timer sends the device to standby. The
timer as one loop handle is shown on a fake loop clock (exact deadlines, containment, close)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import aiohttp
import pytest

from gateway.assessment.jobs import AsrKey, OnTranscript
from gateway.chat.bridge import Backoff, BridgeContext
from gateway.chat.credentials import UpstreamIdentity
from gateway.chat.device import DeviceChat
from gateway.chat.embedded import EmbeddedEngine
from gateway.chat.framing import Framing
from gateway.chat.metrics import ChatMetrics
from gateway.chat.ports import ChatPorts
from gateway.chat.upstream import UpstreamConfig
from gateway.chat.voice import (
    ChatState,
    CueKind,
    EngineFailed,
    Tick,
    VoiceConfig,
    VoiceEffect,
    VoiceEvent,
)
from gateway.metrics import Metrics
from tests.unit.chat.fake_loop import FakeLoop

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
        self.hellos: list[tuple[str, int, int]] = []
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

    def answer_hello(self, dev: str, session_id: str, *, sample_rate: int, frame_ms: int) -> bool:
        self.hellos.append((session_id, sample_rate, frame_ms))
        return True

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
                identify=lambda dev: UpstreamIdentity(dev.replace("_", ":"), None, None),
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


# -- the timer and the downlink as loop callbacks (fake loop clock) ----------------------------

SILENCE_MS = 5_000.0


LEAD_S = 0.010  # chat.tts_lead_s's default
CUES = {kind: (f"{kind.value}-1".encode(), f"{kind.value}-2".encode()) for kind in CueKind}


def fake_chat(
    *, cues: bool = False, config: VoiceConfig | None = None
) -> tuple[DeviceChat, FakeChannel, FakeLoop, Metrics]:
    """A bridged-mode device (no engine, no upstream link) on a loop clock the test moves."""
    loop = FakeLoop()
    metrics = Metrics()

    def spawn(coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        coro.close()
        raise AssertionError(f"no task expected here: {name}")

    ports = ChatPorts(
        alarm=lambda *a: None,
        metrics=ChatMetrics(metrics),
        clock=loop.clock,
        spawn=spawn,
        config=config or VoiceConfig(silence_timeout_ms=SILENCE_MS),
        bridge=None,
        engine=None,
        tts_lead_s=LEAD_S,
        cues=CUES if cues else None,
    )
    channel = FakeChannel()
    chat = DeviceChat(DEV, ports, channel, loop=loop)
    channel.chat = chat
    return chat, channel, loop, metrics


def failures(metrics: Metrics) -> float:
    return metrics.snapshot()["snlpgw_chat_callback_failures_total"]


def test_the_timer_fires_at_the_cores_deadline_and_follows_it() -> None:
    chat, channel, loop, _ = fake_chat()
    chat.opened(SID)
    assert loop.live() == []  # no deadline yet: no timer
    chat.listen("start", "auto", None)
    deadline = chat.core.next_deadline()
    assert deadline == loop.now * 1000.0 + SILENCE_MS
    (timer,) = loop.live()  # one call_at handle, for that deadline
    assert timer.when * 1000.0 == deadline
    loop.run_until(loop.now + 2.0)
    chat.speech(started=True)  # hearing: no deadline, the timer is cancelled
    assert loop.live() == []
    chat.speech(started=False)  # silence again: a new deadline from now
    (timer,) = loop.live()
    assert timer.when == loop.now + SILENCE_MS / 1000.0
    loop.run_until(timer.when - 0.001)
    assert state(chat) is ChatState.PROMPT_LISTEN  # not before the deadline
    assert channel.closed == 0
    loop.run_until(timer.when)
    assert state(chat) is ChatState.CLOSED  # silence: standby, the goodbye went
    assert channel.closed == 1
    assert chat.session_id is None
    assert loop.live() == []


def test_a_timer_firing_a_hair_early_waits_for_the_deadline() -> None:
    chat, channel, loop, _ = fake_chat()
    chat.opened(SID)
    chat.listen("start", "auto", None)
    (timer,) = loop.live()
    deadline = timer.when
    loop.handles.remove(timer)
    loop.now = deadline - 1e-6  # the loop ran the handle before our clock reached it
    timer.callback()
    assert state(chat) is ChatState.PROMPT_LISTEN
    (again,) = loop.live()  # re-armed for the same deadline
    assert again.when == pytest.approx(deadline)
    loop.run_until(deadline)
    assert channel.closed == 1


def test_a_tick_that_raises_is_counted_and_not_retried_until_the_deadline_moves() -> None:
    chat, channel, loop, metrics = fake_chat()
    chat.opened(SID)
    chat.listen("start", "auto", None)
    real = chat.core.handle

    def broken(event: VoiceEvent, now: float) -> list[VoiceEffect]:
        if isinstance(event, Tick):
            raise ZeroDivisionError("a bug in the core")
        return real(event, now)

    chat.core.handle = broken  # type: ignore[method-assign]
    loop.run_until(loop.now + SILENCE_MS / 1000.0)
    assert failures(metrics) == 1.0
    assert loop.live() == []  # no spin on a deadline that raised
    assert state(chat) is ChatState.PROMPT_LISTEN
    chat.core.handle = real  # type: ignore[method-assign]
    chat.speech(started=True)
    chat.speech(started=False)  # the deadline moves: the timer follows it again
    (timer,) = loop.live()
    loop.run_until(timer.when)
    assert channel.closed == 1


def test_a_downlink_item_that_raises_is_counted_and_the_device_goes_on() -> None:
    chat, channel, loop, metrics = fake_chat()
    chat.opened(SID)
    chat.listen("start", "auto", None)
    chat.player.json(b"not json")  # the fake channel's json.loads raises on it
    chat.player.json(b'{"type":"llm","session_id":"s1"}')
    loop.run_ready()
    assert failures(metrics) == 1.0
    assert channel.types() == ["llm:"]


def test_close_stops_the_timer_and_the_downlink() -> None:
    chat, channel, loop, _ = fake_chat()
    chat.opened(SID)
    chat.listen("start", "auto", None)
    chat.player.json(b'{"type":"tts","state":"start","session_id":"s1"}', tts="start")
    chat.player.audio(b"f1")
    assert loop.live() != []
    chat.close()
    assert loop.live() == []
    chat.handle(Tick())  # a late event: handled by the core, but no timer comes back
    assert loop.live() == []
    loop.run_until(loop.now + 3600.0)
    assert channel.published == []
    assert channel.audio == []
    assert channel.closed == 0


# -- voice-session cues, greeting, failure (fake loop clock: exact moments) --------------------


def cue(kind: CueKind) -> list[bytes]:
    return list(CUES[kind])


def test_silence_timeout_plays_the_timeout_tone_then_says_goodbye() -> None:
    chat, channel, loop, metrics = fake_chat(cues=True)
    chat.opened(SID)
    chat.listen("start", "auto", None)
    chat.frame(SID, b"u")  # the device's first datagram: its address is known
    deadline = loop.now + SILENCE_MS / 1000.0
    loop.run_until(deadline)
    assert state(chat) is ChatState.CLOSED
    assert channel.types() == ["tts:start"]  # the tone's bracket opened at the deadline
    loop.run_until(deadline + LEAD_S)
    assert channel.audio == cue(CueKind.TIMEOUT)  # both frames at once (pre-buffer)
    assert channel.closed == 0  # the goodbye waits until the tone had time to play
    loop.run_until(loop.now + 1.0)
    assert channel.types() == ["tts:start", "tts:stop"]
    assert channel.closed == 1
    assert chat.session_id is None
    assert metrics.snapshot()['snlpgw_chat_cues_total{kind="timeout"}'] == 1.0


def test_engine_failure_sends_the_failure_cue_at_once_then_standby() -> None:
    chat, channel, loop, _ = fake_chat(cues=True, config=VoiceConfig(local_segments=True))
    chat.opened(SID)
    chat.listen("start", "auto", None)
    chat.frame(SID, b"u")  # the device's first datagram: its address is known
    chat.speech(started=True)
    chat.core.handle(EngineFailed(0, "x"), loop.clock() * 1000)  # not this turn: nothing
    chat.speech(started=False)
    loop.run_until(loop.now + LEAD_S)
    assert channel.audio == cue(CueKind.SEGMENT_END)  # §1.4: the segment-end cue
    assert channel.types() == ["tts:start"]
    assert state(chat) is ChatState.THINKING  # the cue's tts start is not the reply's
    loop.run_until(loop.now + 1.0)
    failed_at = loop.now
    chat.handle(EngineFailed(1, "asr_timeout"))
    loop.run_ready()
    assert channel.types() == ["tts:start", "tts:start"]  # the failure cue's, at once
    assert loop.now == failed_at
    loop.run_until(failed_at + LEAD_S)  # its frames after the tts-start lead: 10 ms
    assert channel.audio == cue(CueKind.SEGMENT_END) + cue(CueKind.FAILURE)
    loop.run_until(loop.now + 1.0)
    assert channel.types() == ["tts:start", "tts:start", "tts:stop"]
    assert channel.closed == 1  # then standby


def test_upstream_speech_ends_with_the_start_cue_unless_manual() -> None:
    chat, channel, loop, _ = fake_chat(cues=True)
    chat.opened(SID)
    chat.listen("start", "auto", None)
    chat.frame(SID, b"u")  # the device's first datagram: its address is known
    chat._from_upstream({"type": "stt", "text": "hi"})
    chat._from_upstream({"type": "tts", "state": "start"})
    chat.player.audio(b"speech")
    chat._from_upstream({"type": "tts", "state": "stop"})
    loop.run_until(loop.now + 2.0)
    assert channel.audio == [*cue(CueKind.SEGMENT_END), b"speech", *cue(CueKind.START)]
    assert channel.types() == ["tts:start", "stt:", "tts:start", "tts:stop"]
    assert state(chat) is ChatState.PROMPT_LISTEN
    # abort: the gateway's own tts stop ends the speech, the server's late one gets no cue
    chat.listen("start", "manual", None)
    chat._from_upstream({"type": "stt", "text": "hi"})
    chat._from_upstream({"type": "tts", "state": "start"})
    loop.run_until(loop.now + 2.0)
    channel.audio.clear()
    chat._from_upstream({"type": "tts", "state": "stop"})  # manual: the device goes idle
    loop.run_until(loop.now + 2.0)
    assert channel.audio == []
    assert state(chat) is ChatState.IDLE


def test_no_cue_to_a_device_that_never_sent_audio() -> None:
    chat, channel, loop, _ = fake_chat(cues=True)
    chat.opened(SID)
    chat.listen("start", "auto", None)
    loop.run_until(loop.now + SILENCE_MS / 1000.0)
    assert channel.types() == []  # nothing could reach it: the goodbye at once
    assert channel.closed == 1


def test_no_cues_configured_plays_none() -> None:
    chat, channel, loop, _ = fake_chat()
    chat.opened(SID)
    chat.listen("start", "auto", None)
    chat.frame(SID, b"u")  # the device's first datagram: its address is known
    chat._from_upstream({"type": "stt", "text": "hi"})
    loop.run_until(loop.now + 30.0)  # the reply timeout: standby without a cue
    assert channel.audio == []
    assert channel.types() == ["stt:"]
    assert channel.closed == 1


def test_uplink_outside_a_turn_is_counted_by_reason() -> None:
    chat, _, _, metrics = fake_chat()
    chat.opened(SID)
    chat.frame(SID, b"w")  # before the listen (no relay configured: dropped)
    chat.frame("old", b"x")  # another session's: not ours to count
    chat.listen("start", "auto", None)
    chat.frame(SID, b"u")  # the device's first datagram: its address is known
    chat.frame(SID, b"a")  # a turn's frame: not counted here
    chat.listen("stop", None, None)
    chat.frame(SID, b"t")
    snap = metrics.snapshot()
    assert snap['snlpgw_chat_uplink_outside_turn_total{reason="before_listen"}'] == 1.0
    assert snap['snlpgw_chat_uplink_outside_turn_total{reason="thinking"}'] == 1.0
    assert snap['snlpgw_chat_uplink_outside_turn_total{reason="wake_word"}'] == 0.0
