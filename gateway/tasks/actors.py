"""The task service's actor table: one :class:`DeviceActor` per device, created on first sight of
the device while the service runs (an actor is callbacks on the loop, not a task).

Bounded (``max_devices``): when full, the least recently used idle actor (no instance, empty
inbox) is stopped to make room; with none idle, the new device is refused (counted). So fake
device ids cannot lock real boards out of lessons. The last known presence of devices without an
actor is remembered the same way (oldest forgotten; an unknown device counts as online).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Container

from gateway.metrics import Metrics
from gateway.tasks.actor import DeviceActor
from gateway.tasks.actor_parts import ActorMetrics, Ports
from gateway.tasks.core import (
    Catalog,
    ControlReply,
    DeviceRuntime,
    PublishTaskEvent,
    ReadText,
    RuntimeConfig,
    RuntimeState,
    resolve_expected_text,
)
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

log = logging.getLogger(__name__)

STATE_COUNTS_TTL_S = 0.05  # one scan serves every state of one metrics collection

Plan = tuple[tuple[str, ...], tuple[str, ...]]  # (assessment methods or (), the lesson's texts)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class ActorTable:
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
        modes: ModeListener | None,
        speaker: SpeakPort | None = None,
        inline: InlineAssessment | None = None,
        publish_task_event: Callable[[str, PublishTaskEvent], None],
        publish_reply: Callable[[str, ControlReply], None],
        metrics: Metrics,
        max_devices: int,
        archive: AnswerKeeper | None = None,
        devices: DeviceTasks | None = None,
    ) -> None:
        self._devices = devices
        self._catalog = catalog
        self._config = config
        self._read_text = read_text
        self._commands = commands
        self._mic = mic
        self._recorder = recorder
        self._assessment = assessment
        self._modes = modes
        self._archive = archive
        self._speaker = speaker
        self._inline = inline
        self._publish_task_event = publish_task_event
        self._publish_reply = publish_reply
        self._max_devices = max_devices
        # Least recently used first; bounded by max_devices (module doc).
        self.actors: OrderedDict[str, DeviceActor] = OrderedDict()
        # Last known presence of devices without an actor yet; bounded, oldest forgotten.
        self.online: OrderedDict[str, bool] = OrderedDict()
        self._plans: dict[tuple[str, str, str], Plan] = {}
        self._state_counts: tuple[float, Counter[RuntimeState]] | None = None
        self.m = ActorMetrics(metrics)
        self._m_devices = metrics.gauge("runtime_devices", "Devices with a task actor")
        self._m_evicted = metrics.counter(
            "runtime_devices_evicted", "Idle task actors stopped to make room for a new device"
        )
        self._m_refused = metrics.counter(
            "runtime_devices_refused", "Devices given no actor: the table was full of busy ones"
        )
        by_state = metrics.gauge("runtime_instances", "Instances now, by state", ["state"])
        for state in RuntimeState:
            by_state.labels(state.value).set_function(functools.partial(self._count_in, state))

    def _count_in(self, state: RuntimeState) -> float:
        """Actors in ``state``; one pass over the actors per collection, not one per state
        (a full table of 10,000 actors is scanned once per metrics snapshot)."""
        now = time.monotonic()
        if self._state_counts is None or now - self._state_counts[0] > STATE_COUNTS_TTL_S:
            counts = Counter(a.runtime.state for a in self.actors.values())
            self._state_counts = (now, counts)
        return float(self._state_counts[1][state])

    def remember_presence(self, device: str, online: bool) -> None:
        self.online[device] = online
        self.online.move_to_end(device)
        while len(self.online) > self._max_devices:
            self.online.popitem(last=False)

    def new_runtime(self, device: str) -> DeviceRuntime:
        """A fresh runtime for ``device`` (idle; online unless its presence says otherwise)."""
        now = asyncio.get_running_loop().time() * 1000.0
        return DeviceRuntime(
            device,
            self._catalog,
            config=self._config,
            read_text=self._read_text,
            wall_offset_ms=time.time() * 1000.0 - now,
            online=self.online.get(device, True),
        )

    def spawn(
        self,
        device: str,
        runtime: DeviceRuntime | None,
        *,
        keep: Container[str],
    ) -> DeviceActor | None:
        """A new actor for ``device`` (a fresh runtime unless one is given); ``None`` when the
        table is full of busy actors or of devices in ``keep``."""
        if len(self.actors) >= self._max_devices and not self._evict_idle(keep):
            self._m_refused.inc()
            log.error("no actor for %s: %d devices, none idle", device, len(self.actors))
            return None
        if runtime is None:
            runtime = self.new_runtime(device)
        actor = DeviceActor(device, runtime, ports=self._ports(), metrics=self.m)
        self.actors[device] = actor
        self._m_devices.set(len(self.actors))
        log.info("ownership gained %s at_ms=%d", device, _now_ms())
        return actor

    def _evict_idle(self, keep: Container[str]) -> bool:
        """Stop the least recently used idle actor; False when every actor is busy."""
        for device, actor in self.actors.items():
            if actor.idle() and device not in keep:
                self.release(device)
                self._m_evicted.inc()
                return True
        return False

    def release(self, device: str) -> None:
        """Stop acting for ``device`` (its timer cancelled, queued events forgotten). Logged: the
        ownership log is these lines and ``ownership gained``."""
        actor = self.actors.pop(device, None)
        if actor is not None:
            actor.close()
        self._m_devices.set(len(self.actors))
        log.info("ownership released %s at_ms=%d", device, _now_ms())

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
            plan=self.plan,
            modes=self._modes,
            archive=self._archive,
            devices=self._devices,
            speaker=self._speaker,
            inline=self._inline,
        )

    def forget_plans(self) -> None:
        """The catalog was reloaded: plans are made again from the new version."""
        self._plans.clear()

    def plan(self, app_id: str, task_id: str, lesson_id: str) -> Plan:
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
