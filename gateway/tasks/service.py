"""The task runtime component: control requests in, one actor per device, task events out.

Other components feed it through its sink methods (board events, presence, speech, ASR text);
it reaches them only through the ports it was built with. Actors are created on first sight of
a device and owned by this component's TaskGroup (``device[aa_bb…].tasks``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Sequence

from gateway.mqtt import Inbound
from gateway.service import Context
from gateway.tasks.actor import ActorMetrics, DeviceActor, Ports
from gateway.tasks.core import (
    AsrText,
    ButtonPress,
    Catalog,
    ControlAction,
    ControlReply,
    ControlRequest,
    DeviceRuntime,
    InstanceColumns,
    PlaybackEvent,
    Presence,
    PriorityLevel,
    PublishTaskEvent,
    ReadText,
    RuntimeConfig,
    RuntimeEvent,
    RuntimeState,
    StepColumns,
    UtteranceStarted,
    UtteranceStopped,
    resolve_expected_text,
    restore_runtime,
)
from gateway.tasks.ports import CommandSender, MicControl, ModeListener, Recorder, UtteranceSink
from topics import (
    CtlReply,
    PayloadError,
    TopicError,
    TopicKind,
    build_topic,
    encode,
    parse_ctl_request,
    parse_topic,
)
from topics.backend import TASK_EVENT_ADAPTER

log = logging.getLogger(__name__)

# Actors kept (and devices whose presence is remembered). When full, the least recently used
# idle actor (no instance, empty inbox) is stopped to make room; with none idle, the new device
# is refused (counted). So fake device ids cannot lock real boards out of lessons.
MAX_DEVICES = 10_000
STATE_COUNTS_TTL_S = 0.05  # one scan serves every state of one metrics collection
RESPONSE_ROUTES_KEPT = 1_024  # MQTT 5 response topics remembered per pending request
RESTORE_WAIT_S = 10.0  # how long a stored running instance waits for its board's presence

StoredInstance = tuple[InstanceColumns, Sequence[StepColumns]]
LoadRunning = Callable[[], Awaitable[Sequence[StoredInstance]]]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class TaskService:
    name = "tasks"

    def __init__(
        self,
        *,
        catalog: Catalog,
        config: RuntimeConfig,
        read_text: ReadText | None,
        commands: CommandSender,
        mic: MicControl,
        recorder: Recorder,
        assessment: UtteranceSink,
        load_running: LoadRunning | None = None,
        restore_wait_s: float = RESTORE_WAIT_S,
        modes: ModeListener | None = None,
        max_devices: int = MAX_DEVICES,
        owns: Callable[[str], bool] | None = None,
        handover_delay_s: float = 0.0,
    ) -> None:
        self._catalog = catalog
        self._config = config
        self._read_text = read_text
        self._commands = commands
        self._mic = mic
        self._recorder = recorder
        self._assessment = assessment
        self._load_running = load_running
        self._restore_wait_s = restore_wait_s
        # Scale-out (gateway.cluster): act only for devices this gateway owns; adopt the
        # running instances of devices it gains from the store, ``handover_delay_s`` after the
        # change (time for a previous owner that is still alive to see it and stop).
        self._owns = owns or (lambda _dev: True)
        self._handover_delay_s = handover_delay_s
        self._adopt = asyncio.Event()
        self.modes = modes
        self._max_devices = max_devices
        # Least recently used first; bounded by max_devices (see MAX_DEVICES).
        self._actors: OrderedDict[str, DeviceActor] = OrderedDict()
        self._actor_tasks: dict[str, asyncio.Task[None]] = {}
        self._state_counts: tuple[float, Counter[RuntimeState]] | None = None
        # Last known presence of devices without an actor yet; bounded, oldest forgotten (an
        # unknown device counts as online, as it did before it was ever seen).
        self._online: OrderedDict[str, bool] = OrderedDict()
        self._pending_restore: dict[str, StoredInstance] = {}
        self._responses: OrderedDict[str, tuple[str, bytes | None]] = OrderedDict()
        # utterance id → (instance id, step index) where it began; bounded, oldest dropped
        self._speech_steps: OrderedDict[str, tuple[str, int | None]] = OrderedDict()
        self._tg: asyncio.TaskGroup | None = None
        self._ctx: Context | None = None
        self._ready = asyncio.Event()
        self._plans: dict[tuple[str, str, str], tuple[tuple[str, ...], tuple[str, ...]]] = {}

    # -- component contract ------------------------------------------------------------------

    def attach(self, ctx: Context) -> None:
        self._ctx = ctx
        self._m = ActorMetrics(ctx.metrics)
        self._m_ctl_invalid = ctx.metrics.counter(
            "ctl_invalid", "Control requests refused as unreadable/invalid", ["reason"]
        )
        self._m_devices = ctx.metrics.gauge("runtime_devices", "Devices with a task actor")
        self._m_evicted = ctx.metrics.counter(
            "runtime_devices_evicted", "Idle task actors stopped to make room for a new device"
        )
        self._m_refused = ctx.metrics.counter(
            "runtime_devices_refused", "Devices given no actor: the table was full of busy ones"
        )
        self._m_not_owner = ctx.metrics.counter(
            "runtime_not_owner", "Device events and requests left to the device's owner"
        )
        by_state = ctx.metrics.gauge("runtime_instances", "Instances now, by state", ["state"])
        for state in RuntimeState:
            by_state.labels(state.value).set_function(functools.partial(self._count_in, state))
        ctx.mqtt.route("snlpgw/v1/ctl/+", self._on_ctl, qos=1)

    def _count_in(self, state: RuntimeState) -> float:
        """Actors in ``state``; one pass over the actors per collection, not one per state
        (a full table of 10,000 actors is scanned once per metrics snapshot)."""
        now = time.monotonic()
        if self._state_counts is None or now - self._state_counts[0] > STATE_COUNTS_TTL_S:
            counts = Counter(a.runtime.state for a in self._actors.values())
            self._state_counts = (now, counts)
        return float(self._state_counts[1][state])

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            try:
                await self._restore()
                self._ready.set()
                await self._adopt_on_changes()
            finally:
                self._tg = None

    async def wait_ready(self) -> None:
        await self._ready.wait()

    # -- ownership (scale-out) -----------------------------------------------------------------

    def on_owners_changed(self) -> None:
        """Cluster listener: stop acting for devices now owned elsewhere (their state is in
        the store; the new owner resumes them), then adopt the ones gained."""
        for device in [d for d in self._actors if not self._owns(d)]:
            self._release(device)
        for device in [d for d in self._pending_restore if not self._owns(d)]:
            del self._pending_restore[device]
        self._adopt.set()

    async def _adopt_on_changes(self) -> None:
        while True:
            await self._adopt.wait()
            await asyncio.sleep(self._handover_delay_s)
            self._adopt.clear()
            await self._restore()

    def _release(self, device: str) -> None:
        """Stop acting for ``device`` (its actor's task ends; a TaskGroup ignores a child that
        ends cancelled). Logged: the ownership log is these lines and ``ownership gained``."""
        self._actors.pop(device, None)
        task = self._actor_tasks.pop(device, None)
        if task is not None:
            task.cancel()
        self._m_devices.set(len(self._actors))
        log.info("ownership released %s at_ms=%d", device, _now_ms())

    # -- sinks (called by the channels and the assessment side path) ---------------------------

    def on_board_event(self, device: str, event: PlaybackEvent) -> None:
        self._post(device, event)

    def on_button(self, device: str, kind: str) -> None:
        self._post(device, ButtonPress(kind))

    def on_presence(self, device: str, online: bool) -> None:
        self._online[device] = online
        self._online.move_to_end(device)
        while len(self._online) > self._max_devices:
            self._online.popitem(last=False)
        if device in self._pending_restore:
            self._restore_device(device, online)
        self._post(device, Presence(online), create=False)

    def on_speech_started(self, device: str, utterance_id: str) -> None:
        self._speech_event(device, utterance_id, "speech.started", {"utterance_id": utterance_id})
        self._post(device, UtteranceStarted(utterance_id), create=False)

    def on_speech_stopped(
        self, device: str, utterance_id: str, pcm: bytes, duration_ms: int
    ) -> None:
        self._speech_event(
            device,
            utterance_id,
            "speech.stopped",
            {"utterance_id": utterance_id, "duration_ms": duration_ms},
        )
        actor = self._actors.get(device)
        if actor is None:
            return
        actor.keep_utterance(utterance_id, pcm)
        actor.post(UtteranceStopped(utterance_id, duration_ms))

    def _speech_event(
        self, device: str, utterance_id: str, name: str, data: dict[str, object]
    ) -> None:
        """VAD speech events go on the task topic, labelled with the step the utterance began
        in (a window close can cut an utterance after the runtime moved to the next step)."""
        where = self._speech_steps.pop(utterance_id, None)
        if where is None:
            runtime = self.runtime_of(device)
            inst = runtime.instance if runtime else None
            where = (inst.id if inst else "", inst.step.step_index if inst and inst.step else None)
        if name == "speech.started":
            self._speech_steps[utterance_id] = where
            while len(self._speech_steps) > RESPONSE_ROUTES_KEPT:
                self._speech_steps.popitem(last=False)
        self._publish_task_event(device, PublishTaskEvent(name, where[0], where[1], data))

    def start_by_voice(self, device: str, app_id: str, task_id: str, lesson_id: str) -> None:
        """A task the child asked for in CHAT: priority 1 (voice), so anything running at a
        higher priority refuses it ``busy`` and any later request ≥ 1 preempts it."""
        self._post(
            device,
            ControlRequest(
                action=ControlAction.START,
                request_id=f"voice-{time.monotonic_ns():x}",
                app_id=app_id,
                task_id=task_id,
                lesson_id=lesson_id,
                priority=PriorityLevel.VOICE,
                source="voice",
            ),
        )

    def on_asr_text(self, device: str, instance_id: str, step_index: int, text: str) -> None:
        self._post(device, AsrText(instance_id, step_index, text), create=False)

    def runtime_of(self, device: str) -> DeviceRuntime | None:
        actor = self._actors.get(device)
        return actor.runtime if actor else None

    # -- control topic -----------------------------------------------------------------------

    def _on_ctl(self, msg: Inbound) -> None:
        try:
            topic = parse_topic(msg.topic)
        except TopicError:
            self._m_ctl_invalid.labels("topic").inc()
            return
        if topic.kind is not TopicKind.CTL or topic.dev is None:
            return
        if msg.retain:  # a retained request would run again at every (re)subscribe
            self._m_ctl_invalid.labels("retained").inc()
            return
        device = topic.dev
        if not self._owns(device):
            self._m_not_owner.inc()
            return
        try:
            req = parse_ctl_request(msg.payload)
        except PayloadError as exc:
            self._m_ctl_invalid.labels(exc.reason.value).inc()
            self._send_reply(
                device,
                ControlReply("", "", accepted=False, detail=str(exc)[:200]),
                response=(msg.response_topic, msg.correlation_data),
            )
            return
        if msg.response_topic:
            self._responses[req.id] = (msg.response_topic, msg.correlation_data)
            while len(self._responses) > RESPONSE_ROUTES_KEPT:
                self._responses.popitem(last=False)
        self._post(
            device,
            ControlRequest(
                action=ControlAction(req.action),
                request_id=req.id,
                app_id=req.app_id,
                task_id=req.task_id,
                lesson_id=req.lesson_id,
                priority=req.priority,
                source=req.source or "mqtt",
                params=dict(req.params or {}),
                instance_id=req.instance_id,
            ),
        )

    # -- actors ----------------------------------------------------------------------------------

    def _post(self, device: str, event: RuntimeEvent, *, create: bool = True) -> None:
        actor = self._actors.get(device)
        if actor is None:
            if not create or device in self._pending_restore:
                return  # a stored instance is about to be resumed: it gets the next events
            if not self._owns(device):
                self._m_not_owner.inc()
                return
            actor = self._spawn(device, None)
            if actor is None:
                return
        else:
            self._actors.move_to_end(device)
        actor.post(event)

    def _spawn(self, device: str, runtime: DeviceRuntime | None) -> DeviceActor | None:
        if self._tg is None:
            log.error("no actor for %s: the service is not running", device)
            return None
        if len(self._actors) >= self._max_devices and not self._evict_idle():
            self._m_refused.inc()
            log.error("no actor for %s: %d devices, none idle", device, len(self._actors))
            return None
        loop = asyncio.get_running_loop()
        if runtime is None:
            runtime = DeviceRuntime(
                device,
                self._catalog,
                config=self._config,
                read_text=self._read_text,
                wall_offset_ms=time.time() * 1000.0 - loop.time() * 1000.0,
                online=self._online.get(device, True),
            )
        actor = DeviceActor(device, runtime, ports=self._ports(), metrics=self._m)
        self._actors[device] = actor
        self._m_devices.set(len(self._actors))
        task = self._tg.create_task(actor.run(), name=f"device[{device}].tasks")
        self._actor_tasks[device] = task
        log.info("ownership gained %s at_ms=%d", device, _now_ms())
        return actor

    def _evict_idle(self) -> bool:
        """Stop the least recently used idle actor; False when every actor is busy."""
        for device, actor in self._actors.items():
            if actor.idle() and device not in self._pending_restore:
                self._release(device)
                self._m_evicted.inc()
                return True
        return False

    def _ports(self) -> Ports:
        loop = asyncio.get_running_loop()
        return Ports(
            commands=self._commands,
            mic=self._mic,
            recorder=self._recorder,
            assessment=self._assessment,
            publish_task_event=self._publish_task_event,
            publish_reply=self._publish_reply,
            now_ms=lambda: loop.time() * 1000.0,
            plan=self._plan,
            modes=self.modes,
        )

    def _plan(
        self, app_id: str, task_id: str, lesson_id: str
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Assessment methods (empty when disabled) and the lesson's texts (ASR hints); cached."""
        key = (app_id, task_id, lesson_id)
        cached = self._plans.get(key)
        if cached is not None:
            return cached
        task = self._catalog.get(app_id, task_id)
        lesson = task.lesson(lesson_id) if task else None
        if task is None or lesson is None:
            return (), ()
        methods = tuple(task.assessment.methods) if task.assessment.enabled else ()
        texts = (
            resolve_expected_text(task, lesson, i, self._read_text)
            for i in range(len(lesson.clips))
        )
        hints = tuple(dict.fromkeys(t for t in texts if t))
        self._plans[key] = (methods, hints)
        return methods, hints

    # -- restart recovery ------------------------------------------------------------------------

    async def _restore(self) -> None:
        if self._load_running is None:
            return
        try:
            running = await self._load_running()
        except Exception:
            log.exception("could not load running instances; none restored")
            return
        for instance, steps in running:
            device = instance.device_id
            if not self._owns(device) or device in self._pending_restore:
                continue
            actor = self._actors.get(device)
            if actor is not None and actor.runtime.instance is not None:
                continue  # already running here (ours all along, or started since)
            self._pending_restore[device] = (instance, steps)
            if instance.device_id in self._online:
                self._restore_device(instance.device_id, self._online[instance.device_id])
        if self._pending_restore and self._tg is not None:
            self._tg.create_task(self._restore_deadline(), name="tasks.restore-deadline")

    async def _restore_deadline(self) -> None:
        await asyncio.sleep(self._restore_wait_s)
        for device in list(self._pending_restore):
            self._restore_device(device, online=False)

    def _restore_device(self, device: str, online: bool) -> None:
        instance, steps = self._pending_restore.pop(device)
        idle = self._actors.get(device)
        if idle is not None:  # made for an event that came in before the adoption: replace it
            if idle.runtime.instance is not None:
                return
            self._release(device)
        loop = asyncio.get_running_loop()
        now = loop.time() * 1000.0
        try:
            runtime, effects = restore_runtime(
                instance,
                steps,
                self._catalog,
                online=online,
                now_ms=now,
                wall_offset_ms=time.time() * 1000.0 - now,
                config=self._config,
                read_text=self._read_text,
            )
        except Exception:
            log.exception("restoring instance %s failed", instance.instance_id)
            return
        actor = self._spawn(device, runtime)
        if actor is not None:
            actor.perform(effects)

    # -- wire --------------------------------------------------------------------------------------

    def _publish_task_event(self, device: str, effect: PublishTaskEvent) -> None:
        assert self._ctx is not None  # noqa: S101 - attach() runs before anything is published
        try:
            message = TASK_EVENT_ADAPTER.validate_python(
                {
                    "ts": _now_ms(),
                    "device": device,
                    "event": effect.event,
                    "instance_id": effect.instance_id or None,
                    "step_index": effect.step_index,
                    "data": dict(effect.data),
                }
            )
        except ValueError:
            log.exception("task event %s does not fit the contract", effect.event)
            return
        self._ctx.mqtt.publish(build_topic(TopicKind.TASK, dev=device), encode(message), qos=1)

    def _publish_reply(self, device: str, reply: ControlReply) -> None:
        self._send_reply(device, reply, response=self._responses.pop(reply.request_id, None))

    def _send_reply(
        self,
        device: str,
        reply: ControlReply,
        *,
        response: tuple[str | None, bytes | None] | None,
    ) -> None:
        assert self._ctx is not None  # noqa: S101 - attach() runs before anything is published
        accepted = reply.accepted
        body = CtlReply(
            ref=reply.request_id or None,
            device=device,
            action=reply.action or None,  # type: ignore[arg-type]  # runtime actions are Literal-valid
            status="accepted" if accepted else "refused",
            instance_id=reply.instance_id,
            reason=None if accepted else (reply.reason.value if reply.reason else "invalid"),
            running_priority=reply.running_priority,
            detail=reply.detail,
            ts=_now_ms(),
        )
        payload = encode(body)
        # Always on the device's reply topic; also on an MQTT 5 response topic when the request
        # named one (with its correlation data), once if it is the reply topic itself.
        mqtt = self._ctx.mqtt
        reply_topic = build_topic(TopicKind.REPLY, dev=device)
        response_topic, correlation = response if response is not None else (None, None)
        if response_topic == reply_topic:
            mqtt.publish(reply_topic, payload, qos=1, correlation_data=correlation)
            return
        mqtt.publish(reply_topic, payload, qos=1)
        if response_topic:
            mqtt.publish(response_topic, payload, qos=1, correlation_data=correlation)
