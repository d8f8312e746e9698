"""``DeviceRuntime``: one device's task runtime as a pure state machine (no I/O, no asyncio).

``handle(event, now_ms) -> list[RuntimeEffect]``; the shell performs the effects in order, then sleeps
until ``next_deadline()`` (monotonic ms) and delivers ``TimerFired()`` (``on_time(now)``).
Stepping rules live in :mod:`gateway.tasks.core.stepping`; this module holds control requests,
presence, exits and the dispatch table.

Events the outside world can legitimately send at any time (late or duplicate board events,
outcomes of superseded commands, speech outside a window, presence flaps) never raise: they
change nothing and come back as an :class:`Ignored` effect for logging/counting. Only a broken
shell contract raises :class:`IllegalEvent` naming the state: an object that is not an event,
or ``now_ms`` going backwards.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gateway.tasks.core.base import with_state
from gateway.tasks.core.catalog import LessonDef, TaskDef
from gateway.tasks.core.effects import (
    ControlRefusal,
    ControlReply,
    Ignored,
    InstanceColumns,
    InstanceState,
    PublishTaskEvent,
    RunSteps,
    RuntimeEffect,
    StoreInstance,
)
from gateway.tasks.core.events import (
    AsrText,
    AudioPhase,
    ButtonPress,
    CommandOutcome,
    ControlAction,
    ControlRequest,
    PlaybackEvent,
    Presence,
    RuntimeEvent,
    StepsFinished,
    TimerFired,
    UtteranceStarted,
    UtteranceStopped,
)
from gateway.tasks.core.instance import (
    ActiveInstance,
    IllegalEvent,
    RuntimeState,
    StartParams,
    params_of,
    parse_params,
)
from gateway.tasks.core.rules import PriorityLevel, contains_exit_phrase, loops_left, preempts
from gateway.tasks.core.stepping import Stepper

_Refusal = tuple[ControlRefusal, str | None]  # reason, detail
SKIP_KEYS = frozenset({"skip", "next"})  # a board key that skips the step (D9)
_NO_PAUSE = (ControlAction.PAUSE, ControlAction.RESUME)


@dataclass(frozen=True, slots=True)
class _StartPlan:
    task: TaskDef
    lesson: LessonDef
    params: StartParams


class DeviceRuntime(Stepper):
    """The task runtime of one device; construct once per device and feed it every event."""

    def handle(self, event: RuntimeEvent, now_ms: float) -> list[RuntimeEffect]:  # noqa: PLR0911 - the dispatch table
        if now_ms < self._now:
            raise IllegalEvent(self.state, event, f"time went backwards ({now_ms} < {self._now})")
        self._now = now_ms
        match event:
            case TimerFired():
                return self._on_timer(now_ms)
            case ControlRequest():
                return self._control(event, now_ms)
            case PlaybackEvent():
                return self._on_audio(event, now_ms)
            case CommandOutcome():
                return self._on_outcome(event, now_ms)
            case Presence(online=online):
                return self._on_presence(online, now_ms)
            case ButtonPress():
                return self._on_button(event, now_ms)
            case AsrText():
                inst = self._inst
                if (
                    inst
                    and event.instance_id == inst.id
                    and contains_exit_phrase(event.text, self.config.exit_phrases)
                ):
                    return self._cancel("exit_phrase", now_ms)
                return []
            case UtteranceStarted() | UtteranceStopped():
                return self._on_speech(event)
            case StepsFinished():
                return self._steps_finished(event, now_ms)
            case _:
                raise IllegalEvent(self.state, event, "not a runtime event")

    def _steps_finished(self, event: StepsFinished, now: float) -> list[RuntimeEffect]:
        inst = self._inst
        if inst is None or inst.id != event.instance_id:
            return [self._ignored(event, "not the current instance")]
        return self._end(InstanceState.COMPLETED, None, now)

    def on_time(self, now_ms: float) -> list[RuntimeEffect]:
        return self.handle(TimerFired(), now_ms)

    # -- control -------------------------------------------------------------------------
    def _reply(self, req: ControlRequest, **kw: object) -> ControlReply:
        return ControlReply(req.request_id, str(req.action), **kw)  # type: ignore[arg-type]

    def _refuse(
        self, req: ControlRequest, reason: ControlRefusal, detail: str | None = None
    ) -> list[RuntimeEffect]:
        running = (
            self._inst.record.priority if self._inst and reason is ControlRefusal.BUSY else None
        )
        reply = self._reply(
            req, accepted=False, reason=reason, running_priority=running, detail=detail
        )
        return [reply]

    def _control(self, req: ControlRequest, now: float) -> list[RuntimeEffect]:  # noqa: PLR0911, PLR0912 - the control transition table
        if req.priority not in tuple(PriorityLevel):
            return self._refuse(
                req, ControlRefusal.INVALID, f"priority must be 1, 2 or 3: {req.priority!r}"
            )
        if req.action is ControlAction.START:
            return self._start(req, now)
        inst = self._inst
        if inst is None or (req.instance_id is not None and req.instance_id != inst.id):
            return self._refuse(req, ControlRefusal.NO_INSTANCE)
        if not preempts(req.priority, inst.record.priority):
            return self._refuse(req, ControlRefusal.BUSY)
        if self.state is RuntimeState.SCRIPTED and req.action in _NO_PAUSE:
            return self._refuse(req, ControlRefusal.INVALID, "a STEPS task does not pause")
        accepted = self._reply(req, accepted=True, instance_id=inst.id)
        match req.action:
            case ControlAction.VOLUME:
                return self._set_volume(req, inst, accepted)
            case ControlAction.STOP:
                return [accepted, *self._cancel("stopped", now)]
            case ControlAction.PAUSE if self.state is RuntimeState.PAUSED:
                inst.by_control = True
                return [accepted]
            case ControlAction.PAUSE:
                return [accepted, *self._suspend(now, by_control=True)]
            case ControlAction.RESUME if self.state is not RuntimeState.PAUSED:
                return self._refuse(req, ControlRefusal.INVALID, "not paused")
            case ControlAction.RESUME if not self._online:
                return self._refuse(req, ControlRefusal.DEVICE_OFFLINE)
            case ControlAction.RESUME:
                inst.by_control = False
                return [accepted, *self._resume(now)]
            case ControlAction.RESTART if not self._online:
                return self._refuse(req, ControlRefusal.DEVICE_OFFLINE)
            case _:  # RESTART: the same task and lesson again from step 0, as a new instance
                params = {**inst.record.params, "start_step": 0}
                again = replace(
                    req,
                    action=ControlAction.START,
                    app_id=inst.task.app_id,
                    task_id=inst.task.task_id,
                    lesson_id=inst.lesson.lesson_id,
                    params=params,
                )
                cancelled = self._cancel("restarted", now)
                reply, *started = self._start(again, now)
                assert isinstance(reply, ControlReply)  # noqa: S101 - _start replies first
                return [replace(reply, action=str(req.action)), *cancelled, *started]

    def _set_volume(
        self, req: ControlRequest, inst: ActiveInstance, accepted: ControlReply
    ) -> list[RuntimeEffect]:
        """D12: the running instance's volume; its next PLAY_MEDIA carries it (snlp/v1 has
        no volume command of its own)."""
        volume = req.params.get("volume")
        if type(volume) is not int or not 0 <= volume <= 100:
            return self._refuse(req, ControlRefusal.INVALID, "volume must be an integer 0-100")
        inst.volume = volume
        return [accepted, self._event("volume.set", {"volume": volume})]

    def would_refuse(self, req: ControlRequest) -> bool:
        """Whether the runtime as it is now refuses ``req`` (a start, restart or resume): the
        admission line hands such a request over at once instead of giving it a slot."""
        if req.priority not in tuple(PriorityLevel):
            return True
        if req.action is ControlAction.START:
            return not isinstance(self._plan_start(req), _StartPlan)
        inst = self._inst
        if inst is None or (req.instance_id is not None and req.instance_id != inst.id):
            return True
        if not preempts(req.priority, inst.record.priority) or not self._online:
            return True
        return req.action is ControlAction.RESUME and self.state is not RuntimeState.PAUSED

    def _plan_start(self, req: ControlRequest) -> _StartPlan | _Refusal:
        """What a start would run (task, lesson, parameters), or why it is refused."""
        task = self.catalog.get(req.app_id or "", req.task_id or "")
        lesson = task.lesson(req.lesson_id) if task else None
        if task is None or lesson is None:
            return ControlRefusal.UNKNOWN_TASK, f"{req.app_id}/{req.task_id}/{req.lesson_id}"
        parsed = parse_params(req, task, lesson)
        if isinstance(parsed, str):
            return ControlRefusal.INVALID, parsed
        if not self._online:
            return ControlRefusal.DEVICE_OFFLINE, None
        if self._inst is not None and not preempts(req.priority, self._inst.record.priority):
            return ControlRefusal.BUSY, None
        return _StartPlan(task, lesson, parsed)

    def _start(self, req: ControlRequest, now: float) -> list[RuntimeEffect]:
        plan = self._plan_start(req)
        if not isinstance(plan, _StartPlan):
            return self._refuse(req, *plan)
        task, lesson, parsed = plan.task, plan.lesson, plan.params
        effects: list[RuntimeEffect] = []
        if self._inst is not None:
            effects = self._cancel("preempted", now)
        record = InstanceColumns(
            instance_id=self._new_id(),
            device_id=self.device_id,
            app_id=task.app_id,
            task_id=task.task_id,
            lesson_id=lesson.lesson_id,
            mode=task.interaction_mode,
            priority=req.priority,
            source=req.source,
            state=InstanceState.RUNNING,
            reason=None,
            created_ms=self._wall(now),
            params={**params_of(parsed), **_seed_of(req)},
        )
        self._inst = ActiveInstance(
            task, lesson, record, parsed.ratio, parsed.repeat, index=parsed.start
        )
        self._inst.volume, self._inst.speed = parsed.volume, parsed.speed
        reply = self._reply(req, accepted=True, instance_id=record.instance_id)
        started = PublishTaskEvent("instance.started", record.instance_id, None, record.params)
        if task.interaction_mode == "STEPS":
            self._state = RuntimeState.SCRIPTED
            return [
                reply,
                *effects,
                StoreInstance(record),
                started,
                RunSteps(record.instance_id),  # its own sound / indicate steps cue the board
            ]
        return [
            reply,
            *effects,
            StoreInstance(record),
            started,
            *self._cues(self._inst, task.cues.task_start, "TASK_RUNNING"),
            *self._begin_step(parsed.start, now),
        ]

    # -- presence, pause, resume ------------------------------------------------------------
    def _on_presence(self, online: bool, now: float) -> list[RuntimeEffect]:
        self._online = online
        inst = self._inst
        if inst is None or self.state is RuntimeState.SCRIPTED:  # SPEAK is not the board's
            return []
        if not online and self.state in (RuntimeState.PLAYING, RuntimeState.LISTENING):
            return self._suspend(now, by_control=False)
        if not online:  # already paused by control: start the offline grace
            inst.offline, inst.deadline = True, now + self.config.offline_grace_ms
            # the board may not hold its paused play when it is back: resume replays it
            inst.board_paused, inst.play_ref, inst.play_name = False, None, None
            return []
        if self.state is not RuntimeState.PAUSED:
            return []
        inst.offline, inst.deadline = False, None
        return [] if inst.by_control else self._resume(now)

    def _on_timer(self, now: float) -> list[RuntimeEffect]:
        inst = self._inst
        if inst is None or inst.deadline is None or now < inst.deadline:
            return []
        if self.state is RuntimeState.PAUSED:
            return self._cancel("offline", now)
        if self.state is RuntimeState.LISTENING:
            return self._close_window(now)
        return self._fail_step("watchdog", now, stop=True)

    # -- suspend, resume, cancel -----------------------------------------------------------------
    def _suspend(self, now: float, *, by_control: bool) -> list[RuntimeEffect]:
        inst = self._inst
        assert inst is not None  # noqa: S101 - invariant of the state, narrows for mypy
        assert inst.deadline is not None  # noqa: S101 - invariant of the state, narrows for mypy
        phase = self._state
        effects: list[RuntimeEffect] = []
        keep_play = False
        if phase is RuntimeState.LISTENING:
            inst.remaining_ms = max(0.0, inst.deadline - now)
            effects += self._close_utterance(inst)
            if by_control:
                effects.append(self._command(inst, "LISTEN_STOP", {}))
        else:  # PLAYING: keep the loops still to play (D14)
            since = inst.play_since if inst.play_since is not None else now
            inst.played_ms, inst.play_since = inst.played_ms + now - since, None
            inst.loops_left = loops_left(inst.loops, inst.played_ms, inst.loop_ms)
            if by_control and self.audio_pause:  # the board holds the play
                pause = self._command(inst, "AUDIO_PAUSE", {})
                inst.pause_ref, inst.board_paused, keep_play = pause.command_id, True, True
                effects.append(pause)
            elif by_control:
                effects += self._stop_media(inst)
        if not keep_play:
            inst.play_ref = inst.play_name = None
        inst.paused_phase, inst.by_control, inst.offline = phase, by_control, not by_control
        inst.deadline = None if by_control else now + self.config.offline_grace_ms
        self._state = RuntimeState.PAUSED
        reason = "paused" if by_control else "offline"
        inst.record = record = with_state(inst, InstanceState.PAUSED, reason)
        return [*effects, StoreInstance(record), self._event("instance.paused", {"reason": reason})]

    def _resume(self, now: float) -> list[RuntimeEffect]:
        """Continue a paused instance: AUDIO_RESUME the play the board holds, else replay the
        clip (with the loops left) whose window had not opened, or reopen the window for the
        time it had left."""
        inst = self._inst
        assert inst is not None  # noqa: S101 - invariant of the state, narrows for mypy
        inst.record = record = with_state(inst, InstanceState.RUNNING, None)
        effects: list[RuntimeEffect] = [StoreInstance(record), self._event("instance.resumed")]
        if inst.paused_phase is RuntimeState.LISTENING:
            return effects + self._open_window(inst.remaining_ms or 0.0, now)
        held, inst.held = inst.held, None
        if held is not None:  # the play ended while paused: step on from its end now
            self._state = RuntimeState.PLAYING
            if held.kind is AudioPhase.COMPLETED:
                return effects + self._completed(held, now)
            return effects + self._fail_step(str(held.kind), now, stop=False)
        if inst.board_paused:
            resume = self._command(inst, "AUDIO_RESUME", {})
            inst.pause_ref, inst.board_paused, inst.play_since = resume.command_id, False, now
            inst.deadline = now + self.config.watchdog_ms(inst.loop_ms, inst.loops_left or 1)
            inst.watchdog_left = None
            self._state = RuntimeState.PLAYING
            return [*effects, resume]
        return effects + self._play(now, inst.loops_left)

    def _cancel(self, reason: str, now: float, *, listen: bool = True) -> list[RuntimeEffect]:
        inst = self._inst
        assert inst is not None  # noqa: S101 - invariant of the state, narrows for mypy
        effects: list[RuntimeEffect] = []
        held = self._state is RuntimeState.PAUSED and inst.board_paused
        if self._online and (self._state is RuntimeState.PLAYING or held):
            effects = self._stop_media(inst)
        elif self._online and self._state is RuntimeState.LISTENING:
            effects = [self._command(inst, "LISTEN_STOP", {})]
        return effects + self._end(InstanceState.CANCELLED, reason, now, listen=listen)

    # -- the board's key (D9) -----------------------------------------------------------------
    def _on_button(self, ev: ButtonPress, now: float) -> list[RuntimeEffect]:  # noqa: PLR0911 - the key's table
        """short: confirm (close the open window now) or resume a pause; double: pause or
        resume; long: stop the task (back to CHAT, or idle if the task says so); a ``skip``
        key: the rest of the step is skipped."""
        inst = self._inst
        if inst is None:
            return [self._ignored(ev, "no task: the key belongs to CHAT")]
        state = self._state
        if ev.key in SKIP_KEYS and ev.kind == "short":
            return self._skip(now)
        if ev.kind == "long":
            return self._cancel("button", now, listen=inst.task.buttons.long == "chat")
        paused_by_key = state is RuntimeState.PAUSED and inst.by_control and not inst.offline
        if ev.kind == "short" and state is RuntimeState.LISTENING:
            return [self._event("window.confirmed"), *self._close_window(now)]
        if ev.kind in ("short", "double") and paused_by_key:
            inst.by_control = False
            return self._resume(now)
        if ev.kind == "double" and state is not RuntimeState.PAUSED:
            return self._suspend(now, by_control=True)
        return [self._ignored(ev, f"{ev.kind} press in {state.name}")]

    def _skip(self, now: float) -> list[RuntimeEffect]:
        inst = self._inst
        assert inst is not None  # noqa: S101 - the caller checked it
        if self._state is RuntimeState.LISTENING:
            return [self._event("step.skipped"), *self._close_window(now)]
        if self._state is not RuntimeState.PLAYING:
            return [Ignored(self._state.name, "ButtonPress", "skip while paused")]
        effects: list[RuntimeEffect] = [*self._stop_media(inst), self._event("step.skipped")]
        inst.play_ref = inst.play_name = None
        return effects + self._begin_step(inst.index + 1, now)

    def _ignored(self, event: object, reason: str) -> Ignored:
        return Ignored(self.state.name, type(event).__name__, reason)


def _seed_of(req: ControlRequest) -> dict[str, object]:
    """A STEPS task's ``seed`` start parameter, kept with the instance (validated before)."""
    seed = req.params.get("seed")
    return {} if seed is None else {"seed": seed}
