"""One device's CHAT shell: feeds the voice-session core, performs its effects.

Everything here runs on the loop and is synchronous except the device's two long-lived tasks
(``device[…].chat.downlink`` — the :class:`Player`; ``device[…].chat.timer`` — the core's
deadline) and the per-session upstream link or per-turn answer task, all owned by the chat
component's TaskGroup. Effects may cause events (a goodbye closes the session, which reports
``session_closed``): those are queued and handled after the current one, never re-entered.
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
from gateway.chat.bridge import UpstreamBridge
from gateway.chat.player import Player
from gateway.chat.ports import ChatPorts, VoiceChannel
from gateway.chat.upstream import UpstreamError
from gateway.xiaozhi import messages

log = logging.getLogger(__name__)


class DeviceChat:
    def __init__(
        self, dev: str, ports: ChatPorts, channel: VoiceChannel, *, suspended: bool = False
    ) -> None:
        self.dev = dev
        self._p = ports
        self._channel = channel  # the Xiaozhi channel the device's sessions live on
        self.core = v.VoiceSession(ports.config, suspended=suspended)
        self.session_id: str | None = None
        self._pending: deque[v.VoiceEvent] = deque()  # events caused while handling one
        self._busy = False
        self._rearm = asyncio.Event()
        self._pcm = b""  # the last utterance (embedded engine's segment)
        self._end_after_tts = False
        self._task_after_tts = False
        self.player = Player(
            publish=lambda payload: channel.publish(dev, payload),
            send_audio=self._send_audio,
            on_tts=self._on_tts,
            clock=ports.clock,
            count_drop=lambda reason: ports.metrics.dropped.labels(reason).inc(),
            capacity=ports.downlink_capacity,
        )
        self.bridge = (
            UpstreamBridge(
                ctx=ports.bridge,
                dev=dev,
                on_json=self._from_upstream,
                on_audio=self.player.audio,
                on_end=self._upstream_ended,
            )
            if ports.bridge is not None
            else None
        )
        self._own = (
            ports.spawn(self.player.run(), f"device[{dev}].chat.downlink"),
            ports.spawn(self._timer(), f"device[{dev}].chat.timer"),
        )

    @property
    def idle(self) -> bool:
        """No open session and no event being handled: safe to forget (see :meth:`close`)."""
        return self.session_id is None and not self._busy

    def close(self) -> None:
        """Forget this device: its upstream link closed, its tasks ended (a new hello makes a
        new :class:`DeviceChat`)."""
        if self.bridge is not None:
            self.bridge.close()
        for task in self._own:
            task.cancel()

    # -- from the Xiaozhi channel -----------------------------------------------------------

    def opened(self, session_id: str) -> None:
        self.session_id = session_id
        self.player.reset()  # nothing queued for an earlier session goes to this one
        self._end_after_tts = self._task_after_tts = False
        self.handle(v.VoiceOpened())
        if self.core.state is not v.ChatState.SUSPENDED:
            self._channel.set_listening(self.dev, True)  # our VAD drives the timeout

    def closed(self, session_id: str, reason: str) -> None:
        if session_id == self.session_id:
            self.session_id = None
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
        """An accepted uplink frame (hot path: two comparisons, one append)."""
        if self.bridge is not None and self.core.uplink_open and session_id == self.session_id:
            self.bridge.forward(opus)
            self._p.metrics.frames_up.inc()

    def speech(self, started: bool, pcm: bytes = b"") -> None:
        if not started:
            self._pcm = pcm
        self.handle(v.VoiceSpeechStarted() if started else v.VoiceSpeechStopped())

    # -- from the task runtime ---------------------------------------------------------------

    def task_started(self) -> None:
        self.handle(v.TaskStarted())

    def back_to_chat(self) -> None:
        self.handle(v.BackToChat())
        if self.session_id is not None:
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
            self._rearm.set()

    def _perform(self, effect: v.VoiceEffect) -> None:  # noqa: PLR0912 - one branch per effect
        p = self._p
        match effect:
            case v.OpenUpstream():
                if self.bridge is not None and not self.bridge.open():
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
                self._channel.close_session(self.dev)
            case v.VoiceAlarm(alarm=alarm, reason=reason):
                p.alarm(alarm, self.dev, reason)

    async def _timer(self) -> None:
        while True:
            self._rearm.clear()
            deadline = self.core.next_deadline()
            if deadline is None:
                await self._rearm.wait()
                continue
            delay = deadline / 1000.0 - self._p.clock()
            if delay > 0:
                try:
                    async with asyncio.timeout(delay):
                        await self._rearm.wait()
                except TimeoutError:
                    pass
                continue
            self.handle(v.Tick())

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
        if not self.player.json(payload, tts=tts):
            self.handle(v.UpstreamLost("downlink_control_overflow"))
            return
        self._p.metrics.control_down.labels(labels.bounded(kind, labels.XIAOZHI_SERVER_TYPES)).inc()

    def _upstream_ended(self, error: UpstreamError | None) -> None:
        if error is not None:
            self._p.metrics.upstream.labels(error.reason).inc()
            self.handle(v.UpstreamLost(error.reason))
            return
        self._p.metrics.upstream.labels("ended").inc()
        self._end_after_tts = True  # the server closed the chat: goodbye once its audio played
        if self.player.idle:
            self._finish()

    # -- downlink ----------------------------------------------------------------------------

    def _send_audio(self, opus: bytes) -> bool:
        sid = self.session_id
        sent = sid is not None and self._channel.send_audio(self.dev, sid, opus)
        if sent:
            self._p.metrics.frames_down.inc()
        return sent

    def _on_tts(self, state: str) -> None:
        self.handle(v.TtsStarted() if state == "start" else v.TtsStopped())
        if state == "stop" and self._end_after_tts:
            self._finish()
        if state == "stop" and self._task_after_tts:
            self._task_after_tts = False
            if self._p.start_task is not None:
                self._p.start_task(self.dev)

    def _finish(self) -> None:
        self._end_after_tts = False
        self._channel.close_session(self.dev)

    async def _answer(self, turn: int, pcm: bytes) -> None:
        engine, sid = self._p.engine, self.session_id
        if engine is None or sid is None:
            return
        try:
            answer = await engine.answer(self.dev, turn, pcm)
        except Exception:
            log.exception("embedded chat engine failed for %s", self.dev)
            self._p.metrics.upstream.labels("engine_error").inc()
            return  # the core's reply timeout sends the device to standby
        if self.core.turn != turn or self.core.state is not v.ChatState.THINKING:
            return  # aborted, closed or suspended meanwhile
        if sid != self.session_id:
            return
        if answer.heard:
            self.player.json(messages.stt(sid, answer.heard))
            self.handle(v.ServerStt())
        self.player.json(messages.tts(sid, "start"), tts="start")
        self.player.json(messages.tts(sid, "sentence_start", answer.reply.text))
        for frame in answer.frames:
            self.player.audio(frame)
        self.player.json(messages.tts(sid, "stop"), tts="stop")
        self._end_after_tts = answer.reply.end_session
        self._task_after_tts = answer.reply.start_task
