"""One device's task actor: feeds the pure ``DeviceRuntime`` events and timer firings, and
performs its effects through the ports. Nothing here awaits analysis or storage: every port
call is fire-and-forget, so stepping follows the clock alone (SPEC §2.1, §2.2).

No task per device: the actor is a few callbacks on the loop. The task service hands it events
in its own turn (:meth:`DeviceActor.deliver`: handled at once); its window timer is one
``loop.call_at`` handle, re-armed after every event to the runtime's next deadline, whose
firing is handled at once too. So a window close and the next clip's commands reach the MQTT
socket buffer in the timer's own turn of the loop (a task per device cost a cancellation, a
task wake-up and a timeout context per event: one loop turn more on the hot path, and CPU).
Callbacks from other components (a command's outcome) are queued with :meth:`post` and handled
in the next turn, never inside the caller's own bookkeeping.

Queue policy: events wait in a bounded deque (``INBOX_LIMIT``) only while the actor is already
handling one or until the next turn; a full one means a stuck actor — further events are
dropped and counted. An event whose handling raises is logged and counted
(``runtime_event_failures``); the device's next events are still handled and no other device
is touched. Utterance audio waits for its ``SubmitUtterance`` in a small LRU (oldest dropped).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections import OrderedDict, deque
from collections.abc import Callable

from gateway import labels
from gateway.assessment.jobs import SHED_ASR_SATURATED, SHED_VOICE_OVERLOAD
from gateway.logs import DeviceLog
from gateway.tasks.actor_parts import ActorMetrics, Ports
from gateway.tasks.core import (
    CommandOutcome,
    ControlReply,
    DeliveryResult,
    DeviceRuntime,
    Ignored,
    IndicateCue,
    PublishTaskEvent,
    ReturnToChat,
    RunSteps,
    RuntimeEffect,
    RuntimeEvent,
    SendCommand,
    SoundCue,
    StoreInstance,
    StoreStep,
    SubmitUtterance,
    TimerFired,
    WindowLateness,
    outcome_matters,
)
from gateway.tasks.dsl.commands import (
    ClipFinished,
    DeadlinePassed,
    DslEvent,
    SpeakBegan,
    SpeakCut,
    SpeakFinished,
    TranscriptReady,
    VoiceBegan,
    VoiceEnded,
)
from gateway.tasks.ports import UtteranceSink
from gateway.tasks.steps_shell import StepsRunner

INBOX_LIMIT = 256
_TASK_TAKES_DEVICE = frozenset({"instance.started", "instance.restored"})
UTTERANCES_KEPT = 8
# An utterance is submitted for the step whose window is open (or closing): its texts were
# stored with that step's first row. The last two steps' texts are kept (plain string tuples,
# which the garbage collector stops tracking: a full collection walks every tracked object of
# every actor, and 64 kept step rows per device made thousands of devices' pauses grow).
STEPS_KEPT = 2

log = logging.getLogger(__name__)

ActorEvent = RuntimeEvent | DslEvent
_DSL_EVENTS = (
    SpeakBegan,
    SpeakFinished,
    SpeakCut,
    ClipFinished,
    TranscriptReady,
    VoiceBegan,
    VoiceEnded,
    DeadlinePassed,
)


def _cue_outcome(_outcome: DeliveryResult) -> None:
    """A cue's delivery changes nothing (the board channel counts and alarms on its own)."""


class DeviceActor:
    def __init__(
        self, device: str, runtime: DeviceRuntime, *, ports: Ports, metrics: ActorMetrics
    ) -> None:
        self.device = device
        self.runtime = runtime
        self._ports = ports
        self._m = metrics
        self._loop = asyncio.get_running_loop()
        # Bounded: INBOX_LIMIT events; a new one past it is dropped, counted (module doc).
        self._inbox: deque[ActorEvent] = deque()
        self._handling = False  # inside _drain: a nested deliver only queues
        self._scheduled = False  # a _drain is due in the next turn (post)
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None  # the runtime deadline the timer is armed for
        # utterance id → (PCM, the device's Opus packets of it): the last UTTERANCES_KEPT.
        self._utterances: OrderedDict[str, tuple[bytes, tuple[bytes, ...]]] = OrderedDict()
        # (instance, step) → (prompt_text, expected_text) of the last STEPS_KEPT steps.
        self._texts: OrderedDict[tuple[str, int], tuple[str | None, str | None]] = OrderedDict()
        self._log = DeviceLog(log, {"device": device})
        # The next clip's play command after a window close → that close (monotonic ms); at
        # most one entry lives at a time (one lesson per device), removed by its outcome.
        self._gap_from: dict[str, float] = {}
        self._steps: StepsRunner | None = None  # a STEPS task's interpreter, while it runs
        self._dsl_ids = itertools.count(1)
        # The open lesson window's (instance, step, assessment methods).
        self._window_at: tuple[str, int, tuple[str, ...]] | None = None
        # The open window's claim on the ASR: None not asked (no voice session, the loop did not
        # admit it, or the task assesses nothing), True kept (released at its close), False refused.
        self._claimed: bool | None = None

    def idle(self) -> bool:
        """No instance and nothing waiting in the inbox: forgetting it loses nothing."""
        return self.runtime.instance is None and not self._inbox

    def deliver(self, event: ActorEvent) -> bool:
        """Handle ``event`` now, after anything queued before it (the task service's turn)."""
        if not self._queue(event):
            return False
        self._drain()
        return True

    def post(self, event: ActorEvent) -> bool:
        """Handle ``event`` in the next turn of the loop (callbacks from other components)."""
        if not self._queue(event):
            return False
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._drain)
        return True

    def start(self, effects: list[RuntimeEffect]) -> None:
        """Perform a restored runtime's first effects and arm its timer."""
        self.perform(effects)
        self._arm()

    def close(self) -> None:
        """Stop acting: queued events are forgotten and the timer cancelled."""
        self._closed = True
        self._inbox.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = None

    def _queue(self, event: ActorEvent) -> bool:
        if self._closed:
            return False
        if len(self._inbox) >= INBOX_LIMIT:
            self._m.dropped.inc()
            self._log.error("inbox full: dropped %s", type(event).__name__)
            return False
        self._inbox.append(event)
        return True

    def _drain(self) -> None:
        self._scheduled = False
        if self._handling:
            return  # the drain in progress takes it
        self._handling = True
        try:
            while self._inbox and not self._closed:
                self._handle(self._inbox.popleft())
        finally:
            self._handling = False
        self._arm()

    def _handle(self, event: ActorEvent) -> None:
        now = self._loop.time() * 1000.0
        try:
            steps = self._steps
            if isinstance(event, _DSL_EVENTS):
                if steps is not None:
                    steps.handle(event, now)
                return
            mapped = steps.takes(event) if steps is not None else None
            if steps is not None and mapped is not None:
                steps.handle(mapped, now)
                if not isinstance(event, TimerFired):
                    return
            self.perform(self.runtime.handle(event, now))
        except Exception:
            self._m.failed.inc()
            self._log.exception("handling %s failed", type(event).__name__)

    def _arm(self) -> None:
        """Point the timer at the runtime's next deadline (unchanged: left alone)."""
        deadline = None if self._closed else self.runtime.next_deadline()
        steps_at = self._steps.next_deadline() if self._steps is not None else None
        if steps_at is not None and not self._closed:
            deadline = steps_at if deadline is None else min(deadline, steps_at)
        if deadline == self._timer_at:  # None both: no timer; else that timer is armed
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = (
            None if deadline is None else self._loop.call_at(deadline / 1000.0, self._fire)
        )

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = None
        self.deliver(TimerFired())

    def keep_utterance(
        self, utterance_id: str, pcm: bytes, packets: tuple[bytes, ...] = ()
    ) -> None:
        self._utterances[utterance_id] = (pcm, packets)
        while len(self._utterances) > UTTERANCES_KEPT:
            self._utterances.popitem(last=False)

    def perform(self, effects: list[RuntimeEffect]) -> None:
        closed_at: float | None = None  # a close and the next clip's play come in one batch
        for effect in effects:
            if isinstance(effect, WindowLateness):
                closed_at = effect.actual_ms
            elif (
                closed_at is not None
                and isinstance(effect, SendCommand)
                and effect.cmd.startswith("PLAY")
            ):
                self._gap_from = {effect.command_id: closed_at}
                closed_at = None
            self._perform(effect)

    def _tell_modes(self, effect: PublishTaskEvent | ReturnToChat) -> None:
        """CHAT is suspended while a task owns the device and resumes when it returns."""
        modes = self._ports.modes
        if modes is None:
            return
        if isinstance(effect, ReturnToChat):
            modes.back_to_chat(self.device, listen=effect.listen)
        elif effect.event in _TASK_TAKES_DEVICE:
            modes.task_started(self.device)

    def _perform(self, effect: RuntimeEffect) -> None:  # noqa: PLR0912 - the effect table
        p = self._ports
        match effect:
            case SendCommand():
                self._send(effect)
            case SoundCue() | IndicateCue():
                self._cue(effect)
            case PublishTaskEvent():
                self._count(effect)
                p.publish_task_event(self.device, effect)
                self._tell_modes(effect)
                if p.devices is not None:
                    inst = self.runtime.instance
                    mine = inst.record if inst and inst.id == effect.instance_id else None
                    p.devices.task_event(self.device, effect, mine)
            case StoreInstance():
                p.recorder.save_instance(effect.record)
            case StoreStep():
                record = effect.record
                key = (record.instance_id, record.step_index)
                self._texts[key] = (record.prompt_text, record.expected_text)
                self._texts.move_to_end(key)
                while len(self._texts) > STEPS_KEPT:
                    self._texts.popitem(last=False)
                p.recorder.save_step(record)
            case SubmitUtterance():
                self._submit(effect)
            case WindowLateness():
                self._m.windows.inc()
                self._m.lateness.observe(effect.lateness_ms)
            case ControlReply():
                p.publish_reply(self.device, effect)
            case RunSteps():
                self._run_steps(effect.instance_id)
            case ReturnToChat():
                steps, self._steps = self._steps, None
                if steps is not None and steps.instance_id == effect.instance_id:
                    steps.cancel(self._loop.time() * 1000.0)  # stopped, preempted, ...
                p.mic.set_listening(self.device, False)
                self._log.info("instance %s ended; back to CHAT", effect.instance_id)
                self._tell_modes(effect)
            case Ignored():
                # The reason may name a command id: it goes to the log, never into a label.
                self._m.ignored.labels(labels.bounded(effect.event, labels.RUNTIME_EVENTS)).inc()
                self._log.debug("ignored %s in %s: %s", effect.event, effect.state, effect.reason)

    def _send(self, effect: SendCommand) -> None:
        p = self._ports
        self._m.commands.labels(labels.bounded(effect.cmd, labels.COMMANDS)).inc()
        if effect.cmd == "LISTEN_START":
            inst = self.runtime.instance  # the window's step, known now (not at its close,
            # when the runtime may have moved on or ended the instance)
            methods = self._plan_of(inst.id)[0] if inst else ()
            self._window_at = (
                (inst.id, inst.step.step_index, methods) if inst and inst.step else None
            )
            self._claimed = None
            claim = functools.partial(self._claim, p.assessment) if methods else None
            p.mic.set_listening(self.device, True, sheddable=True, claim=claim)
        elif effect.cmd == "LISTEN_STOP":
            p.mic.set_listening(self.device, False)
            claimed, self._claimed = self._claimed, None
            if claimed:
                p.assessment.release_answer(self.device)
            self._shed_captured(claimed)
        ref = effect.command_id
        p.commands.send_command(
            self.device,
            command_id=ref,
            cmd=effect.cmd,
            params=dict(effect.params),
            prio=effect.prio,
            on_outcome=functools.partial(self._on_outcome, ref),
        )

    def _claim(self, assessment: UtteranceSink) -> bool:
        """Asked by the voice channel as the window opens: can the ASR take its answer?"""
        self._claimed = assessment.claim_answer(self.device)
        return self._claimed

    def _shed_captured(self, claimed: bool | None) -> None:
        """The window just closed was captured, not decoded (voice overload, or the ASR could
        not have taken its answer): its packets go to the learning record and its step is
        stored shed, to be reassessed later."""
        at, self._window_at = self._window_at, None
        captured = self._ports.mic.take_captured(self.device)
        if not captured or at is None:
            return
        instance_id, step_index, methods = at
        if self._ports.archive is not None:
            self._ports.archive.submit(
                device=self.device, instance_id=instance_id, step_index=step_index,
                packets=captured,
            )  # fmt: skip
        self._ports.assessment.shed_utterance(
            device=self.device,
            instance_id=instance_id,
            step_index=step_index,
            reason=SHED_ASR_SATURATED if claimed is False else SHED_VOICE_OVERLOAD,
            methods=methods,
        )

    def _plan_of(self, instance_id: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The running instance's assessment methods and ASR hints (none for another one)."""
        inst = self.runtime.instance
        if inst is None or inst.id != instance_id:
            return (), ()
        record = inst.record
        return self._ports.plan(record.app_id, record.task_id, record.lesson_id)

    def _cue(self, effect: SoundCue | IndicateCue) -> None:
        """SOUND / INDICATE: sent like any command; whatever becomes of it changes nothing."""
        if isinstance(effect, SoundCue):
            cmd, params = "SOUND", {"type": effect.sound}
        else:
            cmd, params = "INDICATE", {"state": effect.state}
        self._m.commands.labels(cmd).inc()
        self._ports.commands.send_command(
            self.device,
            command_id=effect.command_id,
            cmd=cmd,
            params=params,
            prio=effect.prio,
            on_outcome=_cue_outcome,
        )

    def _run_steps(self, instance_id: str) -> None:
        inst = self.runtime.instance
        if inst is None or inst.id != instance_id:
            return
        record = inst.record
        methods, hints = self._ports.plan(record.app_id, record.task_id, record.lesson_id)
        self._steps = StepsRunner(
            self.device,
            inst.task,
            inst.lesson,
            instance_id,
            record.priority,
            ports=self._ports,
            send=self._send_for_steps,
            post=self.post,
            take_utterance=self._take_for_steps,
            methods=methods,
            hints=hints,
            params=record.params,
        )
        self._steps.start(self._loop.time() * 1000.0)

    def _take_for_steps(self, utterance_id: str, step_index: int) -> bytes:
        """A STEPS answer's PCM for ASR; its Opus packets go to the learning record."""
        pcm, packets = self._utterances.pop(utterance_id, (b"", ()))
        steps, archive = self._steps, self._ports.archive
        if packets and steps is not None and archive is not None:
            archive.submit(
                device=self.device,
                instance_id=steps.instance_id,
                step_index=step_index,
                packets=packets,
            )
        return pcm

    def _send_for_steps(
        self,
        cmd: str,
        params: dict[str, object],
        on_outcome: Callable[[DeliveryResult], None] | None,
    ) -> None:
        steps = self._steps
        inst = self.runtime.instance
        if steps is None or inst is None:
            return
        self._m.commands.labels(labels.bounded(cmd, labels.COMMANDS)).inc()
        self._ports.commands.send_command(
            self.device,
            command_id=f"{steps.instance_id}.d{next(self._dsl_ids)}",
            cmd=cmd,
            params=params,
            prio=steps.priority,
            on_outcome=on_outcome or _ignore_outcome,
        )

    def _count(self, effect: PublishTaskEvent) -> None:
        self._m.task_events.labels(effect.event).inc()
        reason = effect.data.get("reason")
        if effect.event == "instance.cancelled":
            self._m.cancelled.labels(labels.bounded(reason, labels.CANCEL_REASONS)).inc()
        elif effect.event == "step.failed":
            self._m.step_failures.labels(labels.bounded(reason, labels.STEP_FAILURES)).inc()

    def _on_outcome(self, ref: str, outcome: DeliveryResult) -> None:
        closed_at = self._gap_from.pop(ref, None)
        if closed_at is not None and outcome is DeliveryResult.ACKED:
            self._m.next_clip_gap.observe(asyncio.get_running_loop().time() * 1000.0 - closed_at)
        if outcome_matters(outcome):  # an acked command changes nothing: no turn for it
            self.post(CommandOutcome(ref, outcome))

    def _submit(self, effect: SubmitUtterance) -> None:
        pcm, packets = self._utterances.pop(effect.utterance_id, (b"", ()))
        if packets and self._ports.archive is not None:
            self._ports.archive.submit(
                device=self.device,
                instance_id=effect.instance_id,
                step_index=effect.step_index,
                packets=packets,
            )
        if not pcm:
            self._m.utterances_missing.inc()
            self._log.warning("utterance %s has no audio; not assessed", effect.utterance_id)
            return
        prompt, expected = self._texts.get((effect.instance_id, effect.step_index), (None, None))
        methods, hints = self._plan_of(effect.instance_id)
        self._m.utterances.inc()
        self._ports.assessment.submit_utterance(
            device=self.device,
            instance_id=effect.instance_id,
            step_index=effect.step_index,
            utterance_id=effect.utterance_id,
            pcm=pcm,
            prompt_text=prompt,
            expected_text=expected,
            methods=methods,
            hints=hints,
        )


def _ignore_outcome(_outcome: DeliveryResult) -> None:
    """SOUND, INDICATE and LISTEN_* of a STEPS task: nothing waits for their delivery."""
