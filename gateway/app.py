"""Composition root: which components a production gateway runs, and how they are connected.

Built in one phase (docs/architecture.md): the shared :class:`Context` first, then the task
inbox (so its producers need no reference to the task service), then each component ONCE with
its collaborators passed in; the :class:`Service` only runs them. Channels and the task runtime
keep their own types; the adapters between them are the board channel's ``BoardToTasks`` /
``BoardCommands`` and :class:`VoiceToTasks` below.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.assessment.engine import Backend
from gateway.assessment.path import AssessmentPath
from gateway.board import BoardChannel
from gateway.board.bridge import BoardCommands, BoardToTasks
from gateway.chat.component import ChatComponent
from gateway.cluster import Cluster, Ownership
from gateway.service import Component, Context, Service
from gateway.settings import Settings
from gateway.speech.service import SpeechService
from gateway.store import Store, build_store_components
from gateway.tasks.core import RuntimeConfig, load_catalog, resource_reader
from gateway.tasks.core.admission import AdmissionConfig
from gateway.tasks.durable import DurableCommands
from gateway.tasks.inbox import TaskInbox
from gateway.tasks.records import StoreRecorder
from gateway.tasks.service import TaskService
from gateway.xiaozhi import XiaozhiChannel, utterance_id
from gateway.xiaozhi.messages import DeviceHello
from gateway.xiaozhi.roster import SessionLink

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VoiceToTasks:
    """The Xiaozhi channel's ``VoiceSink`` feeding the task runtime's inbox."""

    inbox: TaskInbox

    def speech_started(self, dev: str, session_id: str, at_ms: float) -> None:
        self.inbox.speech_started(dev, utterance_id(session_id, at_ms))

    def speech_stopped(
        self, dev: str, session_id: str, pcm: bytes, start_ms: float, end_ms: float
    ) -> None:
        uid = utterance_id(session_id, start_ms)
        self.inbox.speech_stopped(dev, uid, pcm, int(end_ms - start_ms))


@dataclass
class SessionEventsTee:
    """The Xiaozhi channel's session events: CHAT's (when it runs), and session ends to SPEAK
    too (its utterances on that session are interrupted)."""

    chat: ChatComponent | None
    speech: SpeechService | None

    def holds_hello(self, dev: str, hello: DeviceHello) -> bool:
        return self.chat is not None and self.chat.holds_hello(dev, hello)

    def session_opened(self, dev: str, session_id: str, channel: SessionLink) -> None:
        if self.chat is not None:
            self.chat.session_opened(dev, session_id, channel)

    def session_closed(self, dev: str, session_id: str, reason: str) -> None:
        if self.speech is not None:
            self.speech.session_closed(dev, session_id, reason)
        if self.chat is not None:
            self.chat.session_closed(dev, session_id, reason)

    def listen(
        self, dev: str, session_id: str, state: str, mode: str | None, text: str | None
    ) -> None:
        if self.chat is not None:
            self.chat.listen(dev, session_id, state, mode, text)

    def abort(self, dev: str, session_id: str, reason: str | None) -> None:
        if self.chat is not None:
            self.chat.abort(dev, session_id, reason)

    def mcp_message(self, dev: str, payload: Mapping[str, Any]) -> None:
        if self.chat is not None:
            self.chat.mcp_message(dev, payload)


@dataclass
class Gateway:
    """The built service plus handles tests and the demo use."""

    service: Service
    tasks: TaskService
    board: BoardChannel
    xiaozhi: XiaozhiChannel
    assessment: AssessmentPath
    store: Store
    chat: ChatComponent | None = None
    speech: SpeechService | None = None


def build_gateway(settings: Settings, *, asr_backend: Backend | None = None) -> Gateway:
    """The production composition; ``asr_backend`` overrides the configured ASR engine."""
    loaded = load_catalog(settings.runtime.catalog_path)
    for warning in loaded.warnings:
        log.warning("catalog: %s", warning)
    ctx = Context.create(settings)
    parts = build_store_components(ctx)
    recorder = StoreRecorder(parts.store)
    inbox = TaskInbox(metrics=ctx.metrics)
    # Scale-out: one owner per device over the live gateways (cluster.enabled; else all ours).
    ownership = Ownership(settings.gateway_id, enabled=settings.cluster.enabled)
    board = BoardChannel(
        settings=settings.board,
        router=ctx.mqtt,
        publisher=ctx.mqtt,
        metrics=ctx.metrics,
        alarms=ctx.ops,
        sink=BoardToTasks(inbox),
        owns=ownership.owns,
        max_devices=settings.board.max_devices,
        max_payload_bytes=settings.mqtt.max_payload_bytes,
    )
    assessment = AssessmentPath(
        ctx=ctx,
        settings=settings.asr,
        store=parts.store,
        on_text=inbox.asr_text,
        backend=asr_backend,
    )
    voice = VoiceToTasks(inbox)
    # CHAT sits in front of the task runtime's voice sink: speech goes to the runtime while a
    # task owns the device, to CHAT otherwise; it also gets the raw uplink and control events.
    chat = None
    if settings.chat.enabled:
        start_task = None
        if settings.chat.voice_task:
            app_id, task_id, lesson_id = settings.chat.voice_task.split("/")
            start_task = functools.partial(
                inbox.start_by_voice, app_id=app_id, task_id=task_id, lesson_id=lesson_id
            )
        chat = ChatComponent(
            ctx=ctx, settings=settings.chat, inner=voice, asr=assessment, start_task=start_task
        )
    # SPEAK needs the channel and the channel tells it of session ends: set right below.
    events = SessionEventsTee(chat, None)
    xiaozhi = XiaozhiChannel(
        settings=settings,
        mqtt=ctx.mqtt,
        metrics=ctx.metrics,
        http=ctx.http,
        admin=ctx.admin,
        voice=chat or voice,
        events=events if (chat is not None or settings.speech.enabled) else None,
        uplink_tap=chat.uplink if chat else None,
        owns=ownership.owns,
        listening_by_default=False,
    )
    speech = None
    if settings.speech.enabled:
        # SPEAK's started/completed/interrupted go to the task runtime (the task DSL).
        speech = SpeechService(
            settings=settings.speech, channel=xiaozhi, sink=inbox, metrics=ctx.metrics
        )
        events.speech = speech
    cluster = Cluster(
        ctx=ctx,
        ownership=ownership,
        udp=xiaozhi,
        listeners=(inbox.owners_changed, board.release_unowned),
    )
    commands = BoardCommands(board)
    tasks = TaskService(
        ctx=ctx,
        inbox=inbox,
        catalog=loaded.catalog,
        config=RuntimeConfig.from_settings(settings.runtime),
        read_text=resource_reader(settings.runtime.resource_dir),
        # Scale-out: a command leaves once the store has the step it follows (durable.py).
        commands=DurableCommands(commands, parts.store) if settings.cluster.enabled else commands,
        mic=xiaozhi,
        recorder=recorder,
        assessment=assessment,
        load_running=recorder.load_running,
        modes=chat,
        speaker=speech,
        inline=assessment,
        owns=ownership.owns,
        handover_delay_s=settings.cluster.handover_delay_s,
        admission=AdmissionConfig(
            rate_per_s=settings.runtime.start_rate_per_s,
            burst=settings.runtime.start_burst,
            max_wait_ms=settings.runtime.start_max_wait_s * 1000.0,
        ),
    )
    components: list[Component] = [*parts.components, cluster, board, xiaozhi, assessment, tasks]
    if chat is not None:
        components.append(chat)
    if speech is not None:
        components.append(speech)
    service = Service(ctx, components)
    return Gateway(service, tasks, board, xiaozhi, assessment, parts.store, chat, speech)


def build_service(settings: Settings) -> Service:
    return build_gateway(settings).service
