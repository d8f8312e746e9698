"""One device's CHAT shell: feeds the voice-session core, performs its effects.

All of it runs on the loop, synchronously; no task lives as long as the device. The downlink
(:class:`Player`) is loop callbacks, and the core's deadline one ``loop.call_at`` handle
re-armed to ``core.next_deadline()`` after every handled event, whose firing hands the core a
``Tick`` (as the task actor's timer). Tasks: only the upstream link (per session) or the
embedded answer (per turn), in the chat component's TaskGroup. Effects may cause events (a
goodbye closes the session, which reports ``session_closed``): queued and handled after the
current one, never re-entered. A ``Tick`` or downlink item that raises is logged and counted
(``snlpgw_chat_callback_failures``), the device goes on; that deadline is not retried until the
core's deadline changes (no spin).

Cues (voice-session v1, :mod:`gateway.chat.cues`; none when the ports carry none): the core
says when (``PlayCue``), the shell wraps them for the firmware, which plays downlink audio only
while Speaking — SEGMENT_END opens a ``tts start`` bracket the reply continues (the device's
microphone is off meanwhile, §2 SEGMENT_END), TIMEOUT and FAILURE are a bracket of their own
and the ``Standby`` after them says goodbye once its ``tts stop`` went (the tone had time to
play); START is the tail of the speech that leads into listening, before its ``tts stop``.
The greeting waits for the session's first uplink frame (before it the device's UDP address is
unknown and nothing could reach it).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Mapping
from typing import Any

from gateway import labels
from gateway.chat import voice as v
from gateway.chat.audio_params import downlink_params
from gateway.chat.bridge import UpstreamBridge
from gateway.chat.embedded import EngineError
from gateway.chat.framing import opus_packet_ms
from gateway.chat.player import Cancellable, Player, Scheduler
from gateway.chat.ports import ChatPorts, VoiceChannel
from gateway.chat.upstream import DeviceHelloInfo, ServerHelloInfo, UpstreamError
from gateway.xiaozhi import messages

log = logging.getLogger(__name__)


class DeviceChat:
    def __init__(
        self,
        dev: str,
        ports: ChatPorts,
        channel: VoiceChannel,
        *,
        suspended: bool = False,
        loop: Scheduler | None = None,  # the running loop; a fake loop clock in unit tests
    ) -> None:
        self.dev = dev
        self._p = ports
        self._channel = channel  # the Xiaozhi channel the device's sessions live on
        self.core = v.VoiceSession(ports.config, suspended=suspended)
        self.session_id: str | None = None
        self._pending: deque[v.VoiceEvent] = deque()  # events caused while handling one
        self._busy = False
        self._loop: Scheduler = loop or asyncio.get_running_loop()
        self._timer: Cancellable | None = None
        self._timer_at: float | None = None  # the core deadline (ms) the timer is armed for
        self._failed_at: float | None = None  # a deadline whose Tick raised: not retried
        self._closed = False
        self._pcm = b""  # the last utterance (embedded engine's segment)
        self._end_after_tts = False
        self._task_after_tts = False
        self._hello = DeviceHelloInfo()  # what the device said in the session's hello
        self._hello_held = False  # its reply waits for the server's hello
        self._heard = False  # an uplink frame of this session arrived (its address is known)
        self._greeting: tuple[str, list[bytes]] | None = None  # ready, waiting for _heard
        self.upstream_session_id: str | None = None  # the server's id of this session
        self.player = Player(
            out=self,
            loop=self._loop,
            clock=ports.clock,
            capacity=ports.downlink_capacity,
            lead_s=ports.tts_lead_s,
            duration=opus_packet_ms,
        )
        self.bridge = (
            UpstreamBridge(
                ctx=ports.bridge,
                dev=dev,
                on_json=self._from_upstream,
                on_audio=self.player.audio,
                on_end=self._upstream_ended,
                on_ready=self._upstream_ready,
            )
            if ports.bridge is not None
            else None
        )

    @property
    def idle(self) -> bool:
        """No open session and no event being handled: safe to forget (see :meth:`close`)."""
        return self.session_id is None and not self._busy

    def close(self) -> None:
        """Forget this device: nothing of it runs afterwards (a new hello makes a new one)."""
        self._closed = True
        if self.bridge is not None:
            self.bridge.close()
        self.player.close()
        self._arm()

    # -- from the Xiaozhi channel -----------------------------------------------------------

    def opened(self, session_id: str, hello: DeviceHelloInfo | None = None) -> None:
        """A new device session; ``hello``: its hello, whose reply this CHAT owes (held by
        :meth:`ChatComponent.holds_hello` until the server's hello), None when answered."""
        self.session_id = session_id
        self._hello_held = hello is not None
        self._hello = hello or DeviceHelloInfo()
        self.upstream_session_id = None
        self.player.reset()  # nothing queued for an earlier session goes to this one
        self.player.set_frame_ms(60)  # what an unheld reply announced
        self._end_after_tts = self._task_after_tts = False
        self._heard = False
        self._greeting = None
        self.handle(v.VoiceOpened())
        if self.core.state is not v.ChatState.SUSPENDED:
            self._channel.set_listening(self.dev, True)  # our VAD drives the timeout

    def closed(self, session_id: str, reason: str) -> None:
        if session_id == self.session_id:
            self.session_id = None
            self.player.reset()  # a cue still queued for it has nowhere to go
            self.handle(v.VoiceClosed(reason))

    def listen(self, state: str, mode: str | None, text: str | None) -> None:
        fields: dict[str, Any] = {"type": "listen", "state": state}
        if mode is not None:
            fields["mode"] = mode
        if text is not None:
            fields["text"] = text
        self._relay(fields)
        match state:
            case "start":
                self.handle(v.VoiceListenStart(mode))
            case "stop":
                self.handle(v.VoiceListenStop())
            case "detect":
                self.handle(v.VoiceListenDetect())

    def abort(self, reason: str | None) -> None:
        self._relay({"type": "abort", **({"reason": reason} if reason else {})})
        self.handle(v.VoiceAbort())

    def mcp(self, payload: Mapping[str, Any]) -> None:
        self._relay({"type": "mcp", "payload": dict(payload)})

    def frame(self, session_id: str, opus: bytes) -> None:
        """An accepted uplink frame (hot path: a comparison, the core's verdict, one append
        or one count)."""
        if session_id != self.session_id:
            return
        if not self._heard:
            self._heard = True
            if self._greeting is not None:
                self._say_greeting()
        verdict = self.core.take_uplink()
        relay = verdict is v.UplinkVerdict.RELAY or verdict is v.UplinkVerdict.WAKE_WORD
        if relay and self.bridge is not None:
            self.bridge.forward(opus)
            self._p.metrics.frames_up.inc()
        counter = self._p.metrics.uplink_outside.get(verdict)
        if counter is not None:
            counter.inc()

    def speech(self, started: bool, pcm: bytes = b"") -> None:
        if not started:
            self._pcm = pcm
        self.handle(v.VoiceSpeechStarted() if started else v.VoiceSpeechStopped())

    # -- from the task runtime ---------------------------------------------------------------

    def task_started(self) -> None:
        self.handle(v.TaskStarted())

    def back_to_chat(self, *, listen: bool = True) -> None:
        self.handle(v.BackToChat())
        if listen and self.session_id is not None:
            self._channel.set_listening(self.dev, True)

    # -- the core ----------------------------------------------------------------------------

    def handle(self, event: v.VoiceEvent) -> None:
        self._pending.append(event)
        if self._busy:
            return
        self._busy = True
        try:
            while self._pending:
                now_ms = self._p.clock() * 1000.0
                for effect in self.core.handle(self._pending.popleft(), now_ms):
                    self._perform(effect)
        finally:
            self._busy = False
            self._arm()

    def _perform(self, effect: v.VoiceEffect) -> None:  # noqa: PLR0912 - one branch per effect
        p = self._p
        match effect:
            case v.OpenUpstream():
                if self.bridge is not None and not self.bridge.open(self._hello):
                    p.metrics.upstream.labels("backoff").inc()
                    self._channel.close_session(self.dev)  # no hammering: goodbye until it passes
            case v.CloseUpstream():
                if self.bridge is not None:
                    self.bridge.close()
            case v.BeginTurn():
                p.metrics.turns.inc()
            case v.EndSegment(turn=turn):
                if p.engine is not None:
                    pcm, self._pcm = self._pcm, b""
                    p.spawn(self._answer(turn, pcm), f"device[{self.dev}].chat.turn")
            case v.StopPlayback(reason=reason) if reason in ("abort", "task"):
                self.player.clear()  # the session goes on: end its speech properly
                if self.player.speaking and self.session_id is not None:
                    self.player.json(messages.tts(self.session_id, "stop"), tts="stop")
                if reason == "task":
                    self._channel.set_listening(self.dev, False)
            case v.StopPlayback():
                self.player.reset()  # closed, or about to be (standby): nothing more to say
            case v.Standby(reason=reason):
                p.metrics.standby.labels(reason).inc()
                if self.bridge is not None:
                    self.bridge.close()
                if self.player.idle:
                    self._channel.close_session(self.dev)
                else:
                    self._end_after_tts = True  # its cue plays first: goodbye at its tts stop
            case v.PlayCue(kind=kind):
                self._cue(kind)
            case v.Greet():
                if p.engine is not None:
                    p.spawn(self._greet(self.core.turn), f"device[{self.dev}].chat.greeting")
            case v.VoiceAlarm(alarm=alarm, reason=reason):
                p.alarm(alarm, self.dev, reason)

    def _arm(self) -> None:
        """Point the timer at the core's next deadline (unchanged: left alone)."""
        deadline = None if self._closed else self.core.next_deadline()
        if deadline == self._failed_at:
            deadline = None
        if deadline == self._timer_at:  # None both: no timer; else that timer is armed
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = None
        if deadline is not None:
            when = self._loop.time() + deadline / 1000.0 - self._p.clock()
            self._timer = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        deadline = self._timer_at
        self._timer = self._timer_at = None
        if deadline is not None and deadline / 1000.0 > self._p.clock():
            self._arm()  # the loop's clock ran a hair ahead of ours: not due yet
            return
        try:
            self.handle(v.Tick())
        except Exception:
            self._failed_at = deadline
            self.count_failure()
            log.exception("CHAT timer of %s failed", self.dev)
            self._arm()

    # -- upstream ----------------------------------------------------------------------------

    def _relay(self, fields: Mapping[str, Any]) -> None:
        if self.bridge is not None and self.core.state is not v.ChatState.SUSPENDED:
            self.bridge.relay(fields)

    def _from_upstream(self, body: dict[str, Any]) -> None:
        sid = self.session_id
        if sid is None:
            return
        kind = body.get("type")
        body["session_id"] = sid  # the device's own session id
        payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        state = body.get("state")
        if kind == "stt":
            self.handle(v.ServerStt())
        tts = state if kind == "tts" and state in ("start", "stop") else None
        if tts == "stop" and self.core.start_cue_after_tts:
            self._cue_frames(v.CueKind.START)  # the server's speech ends with the start cue
        if not self.player.json(payload, tts=tts):
            self.handle(v.UpstreamLost("downlink_control_overflow"))
            return
        self._p.metrics.control_down.labels(labels.bounded(kind, labels.XIAOZHI_SERVER_TYPES)).inc()

    def _upstream_ready(self, server: ServerHelloInfo) -> None:
        """The server's hello: the device's held hello reply goes now, with the server's audio
        parameters (its decoder's rate and frame duration)."""
        sid = self.session_id
        if sid is None:
            return
        self.upstream_session_id = server.session_id
        log.info(
            "chat %s: session %s bridged to server session %s", self.dev, sid, server.session_id
        )
        if not self._hello_held:
            return  # answered at once (bridged again after a task): the decoder stays as told
        self._hello_held = False
        params, problem = downlink_params(server.audio_params, self._hello.audio_params)
        if problem is not None:
            self.count_drop(problem)
        self.player.set_frame_ms(params.frame_ms)
        if self._channel.answer_hello(
            self.dev, sid, sample_rate=params.sample_rate, frame_ms=params.frame_ms
        ):
            self._p.metrics.hellos.labels(str(params.sample_rate)).inc()

    def _upstream_ended(self, error: UpstreamError | None) -> None:
        if error is not None:
            self._p.metrics.upstream.labels(error.reason).inc()
            self.handle(v.UpstreamLost(error.reason))
            return
        self._p.metrics.upstream.labels("ended").inc()
        self._end_after_tts = True  # the server closed the chat: goodbye once its audio played
        if self.player.idle:
            self._finish()

    # -- downlink (the player's Output) ---------------------------------------------------------

    def publish_down(self, payload: bytes) -> None:
        self._channel.publish(self.dev, payload)

    def count_drop(self, reason: str) -> None:
        self._p.metrics.dropped.labels(reason).inc()

    def count_failure(self) -> None:
        self._p.metrics.failed.inc()

    def send_audio(self, opus: bytes) -> bool:
        sid = self.session_id
        sent = sid is not None and self._channel.send_audio(self.dev, sid, opus)
        if sent:
            self._p.metrics.frames_down.inc()
        return sent

    def on_tts(self, state: str) -> None:
        self.handle(v.TtsStarted() if state == "start" else v.TtsStopped())
        if state == "stop" and self._end_after_tts:
            self._finish()
        if state == "stop" and self._task_after_tts:
            self._task_after_tts = False
            if self._p.start_task is not None:
                self._p.start_task(self.dev)

    # -- cues and the greeting -----------------------------------------------------------------

    def _cue_frames(self, kind: v.CueKind) -> None:
        cues = self._p.cues
        if cues is None:
            return
        for frame in cues[kind]:
            self.player.audio(frame)
        self._p.metrics.cues.labels(kind.value).inc()

    def _cue(self, kind: v.CueKind) -> None:
        """A cue of its own: after ``tts start`` (not the core's: a segment-end cue keeps it
        THINKING); TIMEOUT and FAILURE end with ``tts stop``, which the goodbye waits for."""
        sid = self.session_id
        if self._p.cues is None or sid is None or not self._heard:
            return  # before the device's first datagram its address is unknown: no audio
        self.player.json(messages.tts(sid, "start"), tts="start", report=False)
        self._cue_frames(kind)
        if kind is not v.CueKind.SEGMENT_END:
            self.player.json(messages.tts(sid, "stop"), tts="stop")

    async def _greet(self, turn: int) -> None:
        engine, sid = self._p.engine, self.session_id
        if engine is None or sid is None:
            return
        try:
            greeting = await engine.greeting()
        except Exception:
            log.exception("embedded chat engine could not greet %s", self.dev)
            self.handle(v.EngineFailed(turn, "tts_error"))
            return
        if self.core.state is not v.ChatState.GREETING or sid != self.session_id:
            return  # aborted, closed or suspended meanwhile
        self._greeting = greeting
        if self._heard:
            self._say_greeting()

    def _say_greeting(self) -> None:
        sid, greeting = self.session_id, self._greeting
        self._greeting = None
        if sid is None or greeting is None or self.core.state is not v.ChatState.GREETING:
            return
        text, frames = greeting
        self.player.json(messages.tts(sid, "start"), tts="start")
        self.player.json(messages.tts(sid, "sentence_start", text))
        for frame in frames:
            self.player.audio(frame)
        self._cue_frames(v.CueKind.START)
        self.player.json(messages.tts(sid, "stop"), tts="stop")

    def _finish(self) -> None:
        self._end_after_tts = False
        self._channel.close_session(self.dev)

    async def _answer(self, turn: int, pcm: bytes) -> None:
        engine, sid = self._p.engine, self.session_id
        if engine is None or sid is None:
            return
        try:
            answer = await engine.answer(self.dev, turn, pcm)
        except EngineError as exc:
            log.warning("embedded chat engine could not answer %s: %s", self.dev, exc.reason)
            self.handle(v.EngineFailed(turn, exc.reason))  # the failure cue at once, standby
            return
        except Exception:
            log.exception("embedded chat engine failed for %s", self.dev)
            self.handle(v.EngineFailed(turn, "engine_error"))
            return
        if (
            self.core.turn != turn
            or self.core.state is not v.ChatState.THINKING
            or sid != self.session_id
        ):
            return  # aborted, closed, suspended or a new session meanwhile
        if answer.heard:
            self.player.json(messages.stt(sid, answer.heard))
            self.handle(v.ServerStt())
        self.player.json(messages.tts(sid, "start"), tts="start")
        self.player.json(messages.tts(sid, "sentence_start", answer.reply.text))
        for frame in answer.frames:
            self.player.audio(frame)
        reply = answer.reply
        if not (reply.end_session or reply.start_task) and self.core.start_cue_after_tts:
            self._cue_frames(v.CueKind.START)
        self.player.json(messages.tts(sid, "stop"), tts="stop")
        self._end_after_tts = answer.reply.end_session
        self._task_after_tts = answer.reply.start_task
