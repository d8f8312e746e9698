"""The task runtime component: other components put typed events in the task inbox it is built
with (created before them, :mod:`gateway.tasks.inbox`); ``run`` drains it in order into one actor
per device (:mod:`gateway.tasks.actors`), control requests through the admission line
(:mod:`gateway.tasks.starts`: a request that starts a lesson playing waits for a slot, and its
device's later requests behind it). It reaches the others only through the ports it was built
with; MQTT control in, replies and task events out: :mod:`gateway.tasks.wire`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from gateway.service import Context
from gateway.tasks import inbox as ib
from gateway.tasks.actor import DeviceActor
from gateway.tasks.actors import ActorTable, Plan
from gateway.tasks.core import (
    AsrText,
    ButtonPress,
    Catalog,
    ControlReply,
    ControlRequest,
    DeviceRuntime,
    InstanceColumns,
    PlaybackEvent,
    Presence,
    ReadText,
    RuntimeConfig,
    RuntimeEvent,
    StepColumns,
    UtteranceStarted,
    UtteranceStopped,
    restore_runtime,
)
from gateway.tasks.core.admission import AdmissionConfig
from gateway.tasks.dsl.commands import SpeakBegan, SpeakCut, SpeakFinished
from gateway.tasks.ports import (
    AnswerKeeper,
    CommandSender,
    DeviceTasks,
    InlineAssessment,
    MicControl,
    ModeListener,
    Recorder,
    SpeakPort,
    UtteranceSink,
)
from gateway.tasks.starts import StartLine
from gateway.tasks.wire import SyncLesson, TaskWire

log = logging.getLogger(__name__)

# Actors kept (and devices whose presence is remembered); see gateway.tasks.actors.
MAX_DEVICES = 10_000
MAX_AWAITED = 1_024  # control replies awaited in-process (admin API) at once
RESTORE_WAIT_S = 10.0  # how long a stored running instance waits for its board's presence

StoredInstance = tuple[InstanceColumns, Sequence[StepColumns]]
LoadRunning = Callable[[], Awaitable[Sequence[StoredInstance]]]


class TaskService:
    name = "tasks"

    def __init__(
        self,
        *,
        ctx: Context,
        inbox: ib.TaskInbox,
        catalog: Catalog,
        config: RuntimeConfig,
        read_text: ReadText | None,
        commands: CommandSender,
        mic: MicControl,
        recorder: Recorder,
        assessment: UtteranceSink,
        load_running: LoadRunning | None = None,  # None: nothing is restored (no store)
        restore_wait_s: float = RESTORE_WAIT_S,
        modes: ModeListener | None = None,  # None: no CHAT to tell
        archive: AnswerKeeper | None = None,  # None: answers' audio not kept
        devices: DeviceTasks | None = None,  # None: no device executor to tell
        speaker: SpeakPort | None = None,  # None: STEPS tasks cannot speak (no SPEAK)
        inline: InlineAssessment | None = None,  # None: STEPS answers are not transcribed
        max_devices: int = MAX_DEVICES,
        owns: Callable[[str], bool] = lambda _dev: True,
        handover_delay_s: float = 0.0,
        admission: AdmissionConfig = AdmissionConfig(),  # noqa: B008 - frozen, shared safely
        sync: SyncLesson | None = None,  # the ctl action ``sync`` (gateway.content.sync)
    ) -> None:
        self._catalog = catalog
        self._config = config
        self._read_text = read_text
        self._inbox = inbox
        self._load_running = load_running
        self._restore_wait_s = restore_wait_s
        # Scale-out (gateway.cluster): act only for devices this gateway owns; adopt the
        # running instances of devices it gains from the store, ``handover_delay_s`` after the
        # change (time for a previous owner that is still alive to see it and stop).
        self._owns = owns
        self._handover_delay_s = handover_delay_s
        self._adopt = asyncio.Event()
        metrics = ctx.metrics
        self._m_not_owner = metrics.counter(
            "runtime_not_owner", "Device events and requests left to the device's owner"
        )
        self._wire = TaskWire(
            mqtt=ctx.mqtt,
            inbox=inbox,
            owns=owns,
            ctl_invalid=metrics.counter(
                "ctl_invalid", "Control requests refused as unreadable/invalid", ["reason"]
            ),
            not_owner=self._m_not_owner,
            sync=sync,
        )
        self._table = ActorTable(
            catalog=catalog,
            config=config,
            read_text=read_text,
            commands=commands,
            mic=mic,
            recorder=recorder,
            assessment=assessment,
            modes=modes,
            archive=archive,
            devices=devices,
            speaker=speaker,
            inline=inline,
            publish_task_event=self._wire.publish_task_event,
            publish_reply=self._publish_reply,
            metrics=metrics,
            max_devices=max_devices,
        )
        self._actors = self._table.actors
        # Control requests go through the admission line: a herd of starts is spread out.
        self._starts = StartLine(
            admission,
            handle=self._post,
            reply=self._publish_reply,
            would_refuse=self._would_refuse,
            metrics=metrics,
        )
        self._pending_restore: dict[str, StoredInstance] = {}
        # request id -> the future an in-process caller (the admin API) awaits its reply on;
        # bounded by ``MAX_AWAITED`` (past it a caller is told to retry: ``control``).
        self._awaited: dict[str, asyncio.Future[ControlReply]] = {}
        self._tg: asyncio.TaskGroup | None = None  # while running
        self._ready = asyncio.Event()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            try:
                tg.create_task(self._drain(), name="tasks.inbox")
                await self._restore()
                self._ready.set()
                await self._adopt_on_changes()
            finally:
                self._tg = None
                self._starts.close()
                for actor in self._actors.values():
                    actor.close()  # no timer outlives the service

    async def wait_ready(self) -> None:
        await self._ready.wait()

    async def _drain(self) -> None:
        """Every event of the inbox, in order; one event's failure is logged and contained."""
        while True:
            item = await self._inbox.get()  # returns at once while events are waiting
            try:
                self._handle(item)
            except Exception:
                log.exception("task inbox: handling %s failed", type(item).__name__)

    def _handle(self, item: ib.TaskInput) -> None:
        match item:
            case ib.InboxBoardEvent(device, event):
                self.on_board_event(device, event)
            case ib.InboxButton(device, kind, key):
                self.on_button(device, kind, key)
            case ib.InboxPresence(device, online):
                self.on_presence(device, online)
            case ib.InboxSpeechStarted(device, utterance_id):
                self.on_speech_started(device, utterance_id)
            case ib.InboxSpeechStopped(device, utterance_id, pcm, duration_ms, packets):
                self.on_speech_stopped(device, utterance_id, pcm, duration_ms, packets)
            case ib.InboxAsrText(device, instance_id, step_index, text):
                self.on_asr_text(device, instance_id, step_index, text)
            case ib.InboxSpeak():
                self.on_speak(item)
            case ib.InboxControl(device, request):
                self._starts.submit(device, request)
            case ib.InboxOwnersChanged():
                self.on_owners_changed()

    def plan(self, app_id: str, task_id: str, lesson_id: str) -> Plan:
        """A lesson's assessment methods (empty when off or the lesson is gone) and its texts
        (ASR hints), from the current catalog; catch-up assessment reads it."""
        return self._table.plan(app_id, task_id, lesson_id)

    def catalog_swapped(self) -> None:
        """The catalog was reloaded (:mod:`gateway.tasks.catalog_live`): drop what was
        cached from the old version (assessment plans, transcripts read)."""
        self._table.forget_plans()
        clear = getattr(self._read_text, "cache_clear", None)
        if callable(clear):
            clear()

    # -- control from inside the process (admin API, CLI) ----------------------------------------

    def owns(self, device: str) -> bool:
        return self._owns(device)

    async def control(self, device: str, request: ControlRequest) -> ControlReply | None:
        """Put ``request`` in the inbox (the path a control-topic request takes: admission
        line, priorities, the device's actor) and await its reply; the reply also goes out on
        the device's reply topic as for MQTT. None: not taken (the inbox is full, too many
        replies awaited already, or a request with this id is waiting)."""
        if len(self._awaited) >= MAX_AWAITED or request.request_id in self._awaited:
            return None
        future: asyncio.Future[ControlReply] = asyncio.get_running_loop().create_future()
        self._awaited[request.request_id] = future
        try:
            if not self._inbox.put(ib.InboxControl(device, request)):
                return None
            return await future
        finally:
            self._awaited.pop(request.request_id, None)

    def _publish_reply(self, device: str, reply: ControlReply) -> None:
        self._wire.publish_reply(device, reply)
        future = self._awaited.get(reply.request_id)
        if future is not None and not future.done():
            future.set_result(reply)

    # -- ownership (scale-out) -----------------------------------------------------------------

    def on_owners_changed(self) -> None:
        """Cluster listener: stop acting for devices now owned elsewhere (their state is in
        the store; the new owner resumes them), then adopt the ones gained."""
        for device in [d for d in self._actors if not self._owns(d)]:
            self._table.release(device)
        for device in [d for d in self._starts.devices() if not self._owns(d)]:
            self._starts.release(device)  # its waiting requests are refused: retry elsewhere
        for device in [d for d in self._pending_restore if not self._owns(d)]:
            del self._pending_restore[device]
        self._adopt.set()

    async def _adopt_on_changes(self) -> None:
        while True:
            await self._adopt.wait()
            await asyncio.sleep(self._handover_delay_s)
            self._adopt.clear()
            await self._restore()

    # -- handlers (one per inbox event; shell tests call them directly) -------------------------

    def on_board_event(self, device: str, event: PlaybackEvent) -> None:
        self._post(device, event)

    def on_button(self, device: str, kind: str, key: str | None = None) -> None:
        self._post(device, ButtonPress(kind, key))

    def on_presence(self, device: str, online: bool) -> None:
        self._table.remember_presence(device, online)
        if device in self._pending_restore:
            self._restore_device(device, online)
        self._post(device, Presence(online), create=False)

    def on_speech_started(self, device: str, utterance_id: str) -> None:
        self._speech_event(device, utterance_id, "speech.started", {"utterance_id": utterance_id})
        self._post(device, UtteranceStarted(utterance_id), create=False)

    def on_speech_stopped(
        self,
        device: str,
        utterance_id: str,
        pcm: bytes,
        duration_ms: int,
        packets: tuple[bytes, ...] = (),
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
        actor.keep_utterance(utterance_id, pcm, packets)
        actor.deliver(UtteranceStopped(utterance_id, duration_ms))

    def _speech_event(
        self, device: str, utterance_id: str, name: str, data: dict[str, object]
    ) -> None:
        runtime = self.runtime_of(device)
        inst = runtime.instance if runtime else None
        now_at = (inst.id if inst else "", inst.step.step_index if inst and inst.step else None)
        self._wire.speech_event(device, utterance_id, name, data, now_at=now_at)

    def on_speak(self, item: ib.InboxSpeak) -> None:
        """SPEAK's result: to the device's STEPS interpreter (nothing else speaks through it)."""
        actor = self._actors.get(item.device)
        if actor is None:
            return
        event: SpeakBegan | SpeakFinished | SpeakCut
        if item.phase == "started":
            event = SpeakBegan(item.speak_id)
        elif item.phase == "completed":
            event = SpeakFinished(item.speak_id, item.duration_ms)
        else:
            event = SpeakCut(item.speak_id, item.reason)
        actor.deliver(event)

    def on_asr_text(self, device: str, instance_id: str, step_index: int, text: str) -> None:
        self._post(device, AsrText(instance_id, step_index, text), create=False)

    def runtime_of(self, device: str) -> DeviceRuntime | None:
        actor = self._actors.get(device)
        return actor.runtime if actor else None

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
        actor.deliver(event)

    def _would_refuse(self, device: str, request: ControlRequest) -> bool:
        """Whether the device's runtime (a fresh one if it has no actor) refuses ``request``
        now; one that waits for a stored lesson to resume is not asked (its actor is coming)."""
        actor = self._actors.get(device)
        if actor is not None:
            return actor.runtime.would_refuse(request)
        if device in self._pending_restore:
            return False
        return self._table.new_runtime(device).would_refuse(request)

    def _spawn(self, device: str, runtime: DeviceRuntime | None) -> DeviceActor | None:
        if self._tg is None:
            log.error("no actor for %s: the service is not running", device)
            return None
        return self._table.spawn(device, runtime, keep=self._pending_restore)

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
            if instance.device_id in self._table.online:
                self._restore_device(instance.device_id, self._table.online[instance.device_id])
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
            self._table.release(device)
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
            actor.start(effects)
