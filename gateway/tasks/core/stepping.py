"""Clock-stepped lessons (SPEC §5): play → audio.completed → listen window → timer → next.

Per mode:
  SHADOWING / FOLLOW_READ: PLAYING --completed--> LISTENING --timer--> PLAYING(i+1) | done
  PLAY_AUDIO (repeater):   PLAYING(repeat N) --the board's one completed--> next clip | done
  LISTEN:                  LISTENING(listen_ms) --timer--> done
  any PLAYING: audio.failed / unsolicited audio.stopped / watchdog / play not delivered
               --> step marked failed, next clip at once (never replayed, never waits).
ASR never steps; speech only feeds the assessment side path (the last utterance of a window wins).
"""

from __future__ import annotations

from gateway.tasks.core.base import RuntimeBase, with_state
from gateway.tasks.core.effects import (
    Ignored,
    InstanceState,
    RuntimeEffect,
    StepColumns,
    StoreInstance,
    StoreStep,
    SubmitUtterance,
    WindowLateness,
)
from gateway.tasks.core.events import (
    AudioPhase,
    CommandOutcome,
    DeliveryResult,
    PlaybackEvent,
    UtteranceStarted,
    UtteranceStopped,
    outcome_matters,
)
from gateway.tasks.core.expected import resolve_expected_text
from gateway.tasks.core.instance import ActiveInstance, IllegalEvent, RuntimeState
from gateway.tasks.core.rules import listen_window_ms


class Stepper(RuntimeBase):
    """Lesson stepping and board/mic events; :class:`DeviceRuntime` adds control on top."""

    def adopt(self, inst: ActiveInstance, now: float, *, paused: bool) -> list[RuntimeEffect]:
        """Take over an instance rebuilt from storage (see :func:`restore_runtime`)."""
        if self._inst is not None:
            raise IllegalEvent(self._state, inst, "adopt needs an idle runtime")
        self._now = max(self._now, now)
        self._inst = inst
        restored = self._event("instance.restored", {"paused": paused})
        if not paused or inst.index >= inst.step_count:
            inst.record = record = with_state(inst, InstanceState.RUNNING, None)
            return [StoreInstance(record), restored, *self._begin_step(inst.index, now)]
        self._new_step(inst, inst.index)
        listen = inst.mode == "LISTEN"
        inst.paused_phase = RuntimeState.LISTENING if listen else RuntimeState.PLAYING
        inst.remaining_ms = float(inst.task.listen_ms) if listen else None
        inst.by_control, inst.offline = True, not self._online
        inst.deadline = now + self.config.offline_grace_ms if inst.offline else None
        self._state = RuntimeState.PAUSED
        return [restored]

    # -- steps -----------------------------------------------------------------------------
    def _begin_step(self, index: int, now: float) -> list[RuntimeEffect]:
        inst = self._inst
        assert inst is not None  # noqa: S101 - invariant of the state, narrows for mypy
        if index >= inst.step_count:
            return self._end(InstanceState.COMPLETED, None, now)
        self._new_step(inst, index)
        if inst.mode == "LISTEN":
            return self._open_window(float(inst.task.listen_ms), now)
        return self._play(now)

    def _new_step(self, inst: ActiveInstance, index: int) -> None:
        inst.index = index
        if inst.mode == "LISTEN":
            inst.step = StepColumns(inst.id, index, None, None)
            return
        clip = inst.lesson.clips[index]
        name = inst.task.board_path(inst.lesson, clip)
        expected = resolve_expected_text(inst.task, inst.lesson, index, self._read_text)
        inst.step = StepColumns(inst.id, index, name, expected)

    def _play(self, now: float, loops: int | None = None) -> list[RuntimeEffect]:
        """PLAY_MEDIA of the step's clip; ``loops``: what a pause left of a repeater's N."""
        inst = self._inst
        assert inst is not None  # noqa: S101 - invariant of the state, narrows for mypy
        assert inst.step is not None  # noqa: S101 - invariant of the state, narrows for mypy
        repeat = inst.repeat if inst.mode == "PLAY_AUDIO" else 1
        repeat = loops if loops is not None else repeat
        name = inst.step.prompt_text
        params: dict[str, object] = {"name": name, "repeat": repeat}
        if inst.volume is not None:
            params["volume"] = inst.volume
        if inst.speed != 1.0:
            params["speed"] = inst.speed
        cmd = self._command(inst, "PLAY_MEDIA", params)
        inst.play_ref, inst.play_name = cmd.command_id, name
        known = inst.lesson.duration_ms(inst.lesson.clips[inst.index])
        inst.loop_ms = known / inst.speed if known else None
        inst.loops, inst.played_ms, inst.play_since, inst.loops_left = repeat, 0.0, now, None
        inst.board_paused, inst.pause_ref, inst.held = False, None, None
        inst.deadline = now + self.config.watchdog_ms(inst.loop_ms, repeat)
        inst.watchdog_left = None
        self._state = RuntimeState.PLAYING
        step = inst.set_step(played_ms=self._wall(now))
        played = self._event("step.played", {"name": name, "command_id": cmd.command_id})
        return [StoreStep(step), cmd, *self._cues(inst, None, "PLAYING"), played]

    def _open_window(self, window_ms: float, now: float) -> list[RuntimeEffect]:
        inst = self._inst
        assert inst is not None  # noqa: S101 - invariant of the state, narrows for mypy
        assert inst.step is not None  # noqa: S101 - invariant of the state, narrows for mypy
        cmd = self._command(inst, "LISTEN_START", {})
        inst.deadline = now + window_ms
        inst.open_utterance = None
        self._state = RuntimeState.LISTENING
        opened = inst.step.window_opened_ms or self._wall(now)
        step = inst.set_step(
            window_opened_ms=opened, window_planned_close_ms=self._wall(inst.deadline)
        )
        data: dict[str, object] = {
            "window_ms": round(window_ms),
            "planned_close_ms": step.window_planned_close_ms,
        }
        cues = self._cues(inst, inst.task.cues.window_open, "LISTENING")
        return [cmd, *cues, StoreStep(step), self._event("window.opened", data)]

    def _close_utterance(self, inst: ActiveInstance) -> list[RuntimeEffect]:
        if inst.open_utterance is None or inst.step is None:
            return []
        utterance, inst.open_utterance = inst.open_utterance, None
        return [SubmitUtterance(inst.id, inst.step.step_index, utterance, truncated=True)]

    def _close_window(self, now: float) -> list[RuntimeEffect]:
        inst = self._inst
        assert inst is not None  # noqa: S101 - invariant of the state, narrows for mypy
        assert inst.step is not None  # noqa: S101 - invariant of the state, narrows for mypy
        assert inst.deadline is not None  # noqa: S101 - invariant of the state, narrows for mypy
        closed = WindowLateness(inst.id, inst.step.step_index, inst.deadline, now)
        effects: list[RuntimeEffect] = [
            self._command(inst, "LISTEN_STOP", {}),
            *self._cues(inst, inst.task.cues.window_close, "PROCESSING"),
            *self._close_utterance(inst),
        ]
        step = inst.set_step(window_closed_ms=self._wall(now))
        opened, planned = step.window_opened_ms, step.window_planned_close_ms
        data: dict[str, object] = {
            "planned_close_ms": planned,
            "actual_close_ms": step.window_closed_ms,
            "lateness_ms": round(closed.lateness_ms),
            "window_ms": planned - opened if planned is not None and opened is not None else 0,
        }
        effects += [closed, StoreStep(step), self._event("window.closed", data)]
        return effects + self._begin_step(inst.index + 1, now)

    def _fail_step(self, reason: str, now: float, *, stop: bool) -> list[RuntimeEffect]:
        inst = self._inst
        assert inst is not None  # noqa: S101 - invariant of the state, narrows for mypy
        effects: list[RuntimeEffect] = self._stop_media(inst) if stop else []
        effects += self._cues(inst, inst.task.cues.error, "ERROR")
        inst.play_ref = inst.play_name = None
        step = inst.set_step(failure=reason)
        effects += [StoreStep(step), self._event("step.failed", {"reason": reason})]
        return effects + self._begin_step(inst.index + 1, now)

    # -- board events ------------------------------------------------------------------------
    def _is_current_play(self, ev: PlaybackEvent) -> bool:
        inst = self._inst
        if inst is None or inst.play_ref is None or self._state is not RuntimeState.PLAYING:
            return False
        return ev.ref == inst.play_ref if ev.ref is not None else ev.name == inst.play_name

    def _requested_stop(self, ev: PlaybackEvent) -> bool:
        for entry in self._stopping:
            ref, name = entry
            if (ev.ref is not None and ev.ref == ref) or (ev.ref is None and ev.name == name):
                self._stopping.remove(entry)
                return True
        return False

    def _held_play(self, ev: PlaybackEvent) -> bool:
        """An event of the play the board holds paused (AUDIO_PAUSE accepted)."""
        inst = self._inst
        if inst is None or not inst.board_paused or self._state is not RuntimeState.PAUSED:
            return False
        return ev.ref == inst.play_ref if ev.ref is not None else ev.name == inst.play_name

    def _on_audio(self, ev: PlaybackEvent, now: float) -> list[RuntimeEffect]:
        if ev.kind is AudioPhase.STOPPED and self._requested_stop(ev):
            return [Ignored(self._state.name, str(ev.kind), "stop requested by the gateway")]
        if self._held_play(ev):
            inst = self._inst
            assert inst is not None  # noqa: S101 - _held_play checked it
            if ev.kind in (AudioPhase.COMPLETED, AudioPhase.FAILED, AudioPhase.STOPPED):
                inst.held = ev  # the play ended before the pause took: acted on at resume
            return []
        if not self._is_current_play(ev):
            return [Ignored(self._state.name, str(ev.kind), "not the current play")]
        inst = self._inst
        assert inst is not None  # noqa: S101 - invariant of the state, narrows for mypy
        match ev.kind:
            case AudioPhase.COMPLETED:
                return self._completed(ev, now)
            case AudioPhase.FAILED | AudioPhase.STOPPED:
                return self._fail_step(str(ev.kind), now, stop=False)
            case AudioPhase.STARTED:
                inst.play_since = now
                if ev.duration_ms:
                    inst.loop_ms = float(ev.duration_ms)
                    inst.deadline = now + self.config.watchdog_ms(ev.duration_ms, inst.loops)
            case AudioPhase.PAUSED if inst.watchdog_left is None and inst.deadline is not None:
                inst.watchdog_left = inst.deadline - now
                inst.deadline = now + self.config.completion_max_ms
                since = inst.play_since if inst.play_since is not None else now
                inst.played_ms, inst.play_since = inst.played_ms + now - since, None
            case AudioPhase.RESUMED if inst.watchdog_left is not None:
                inst.deadline, inst.watchdog_left = now + inst.watchdog_left, None
                inst.play_since = now
            case _:
                pass
        return []

    def _completed(self, ev: PlaybackEvent, now: float) -> list[RuntimeEffect]:
        inst = self._inst
        assert inst is not None  # noqa: S101 - invariant of the state, narrows for mypy
        duration = ev.duration_ms or inst.lesson.duration_ms(inst.lesson.clips[inst.index]) or 0
        inst.play_ref = inst.play_name = None
        step = inst.set_step(completed_ms=self._wall(now), duration_ms=duration)
        if inst.mode == "PLAY_AUDIO":
            return [StoreStep(step), *self._begin_step(inst.index + 1, now)]
        min_window = inst.task.min_window_ms
        if min_window is None:
            min_window = self.config.min_window_ms
        return self._open_window(listen_window_ms(duration, inst.ratio, min_window), now)

    def _on_outcome(self, ev: CommandOutcome, now: float) -> list[RuntimeEffect]:
        if not outcome_matters(ev.outcome):
            return []
        inst = self._inst
        if inst is not None and ev.ref == inst.play_ref and self._state is RuntimeState.PLAYING:
            return self._fail_step(f"play_{ev.outcome}", now, stop=False)
        if inst is not None and ev.ref is not None and ev.ref == inst.pause_ref:
            return self._pause_not_taken(ev, now)
        return [Ignored(self._state.name, "CommandOutcome", f"{ev.outcome} for {ev.ref}")]

    def _pause_not_taken(self, ev: CommandOutcome, now: float) -> list[RuntimeEffect]:
        """AUDIO_PAUSE or AUDIO_RESUME did not reach or was refused by the board: today's way
        instead (STOP_MEDIA now, or at resume a replay of the loops left). A rejection means
        the board lacks them: this device gets STOP_MEDIA + replay from now on."""
        inst = self._inst
        assert inst is not None  # noqa: S101 - the caller checked it
        inst.pause_ref = None
        if ev.outcome is DeliveryResult.REJECTED:
            self.audio_pause = False
        effects: list[RuntimeEffect] = []
        if self._online and inst.play_ref is not None:
            effects = self._stop_media(inst)
        inst.board_paused = False
        if self._state is RuntimeState.PAUSED:  # the pause: resume replays the loops left
            inst.play_ref = inst.play_name = None
            return effects
        return effects + self._play(now, inst.loops_left)  # the resume: replay them now

    def _on_speech(self, ev: UtteranceStarted | UtteranceStopped) -> list[RuntimeEffect]:
        inst = self._inst
        if inst is None:  # CHAT: the mic belongs to the conversation, not to a task
            return []
        if inst.step is None or self._state is not RuntimeState.LISTENING:
            return [Ignored(self._state.name, type(ev).__name__, "no listen window open")]
        if isinstance(ev, UtteranceStarted):
            inst.open_utterance = ev.utterance_id
            return []
        inst.open_utterance = None
        return [SubmitUtterance(inst.id, inst.step.step_index, ev.utterance_id)]
