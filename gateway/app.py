"""Composition root: which components a production gateway runs, and how they are connected.

Channels and the task runtime keep their own types; the adapters between them are the board
channel's ``BoardBridge`` and :class:`VoiceToTasks` below.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gateway.assessment.engine import Backend
from gateway.assessment.path import AssessmentPath
from gateway.board import BoardChannel
from gateway.board.bridge import BoardBridge
from gateway.chat.component import ChatComponent
from gateway.cluster import Cluster
from gateway.service import Component, Context, Service
from gateway.settings import Settings
from gateway.store import Store, build_store_components
from gateway.tasks.core import RuntimeConfig, load_catalog, resource_reader
from gateway.tasks.durable import DurableCommands
from gateway.tasks.records import StoreRecorder
from gateway.tasks.service import TaskService
from gateway.xiaozhi import XiaozhiChannel, utterance_id

log = logging.getLogger(__name__)


@dataclass
class VoiceToTasks:
    """The Xiaozhi channel's ``VoiceSink`` feeding the task runtime (bound once both exist)."""

    tasks: TaskService | None = None

    def speech_started(self, dev: str, session_id: str, at_ms: float) -> None:
        if self.tasks is not None:
            self.tasks.on_speech_started(dev, utterance_id(session_id, at_ms))

    def speech_stopped(
        self, dev: str, session_id: str, pcm: bytes, start_ms: float, end_ms: float
    ) -> None:
        if self.tasks is not None:
            uid = utterance_id(session_id, start_ms)
            self.tasks.on_speech_stopped(dev, uid, pcm, int(end_ms - start_ms))


@dataclass
class _Owns:
    """Transitional (helper wiring builds the ownership before the channels): the cluster's
    ``owns`` once it exists."""

    cluster: Cluster | None = None

    def __call__(self, dev: str) -> bool:
        return self.cluster is None or self.cluster.owns(dev)


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


def build_gateway(settings: Settings, *, asr_backend: Backend | None = None) -> Gateway:
    """The production composition; ``asr_backend`` overrides the configured ASR engine."""
    loaded = load_catalog(settings.runtime.catalog_path)
    for warning in loaded.warnings:
        log.warning("catalog: %s", warning)
    ctx = Context.create(settings)
    parts = build_store_components(settings)
    recorder = StoreRecorder(parts.store)
    board = BoardChannel(
        settings=settings.board,
        max_devices=settings.board.max_devices,
        max_payload_bytes=settings.mqtt.max_payload_bytes,
    )
    bridge = BoardBridge(board)
    assessment = AssessmentPath(settings=settings.asr, store=parts.store, backend=asr_backend)
    voice = VoiceToTasks()
    # CHAT sits in front of the task runtime's voice sink: speech goes to the runtime while a
    # task owns the device, to CHAT otherwise; it also gets the raw uplink and control events.
    chat = (
        ChatComponent(settings=settings.chat, inner=voice, asr=assessment)
        if settings.chat.enabled
        else None
    )
    # Scale-out: one owner per device over the live gateways (cluster.enabled; else all ours).
    owns = _Owns()
    xiaozhi = XiaozhiChannel(
        settings=settings,
        mqtt=ctx.mqtt,
        metrics=ctx.metrics,
        http=ctx.http,
        admin=ctx.admin,
        voice=chat or voice,
        events=chat,
        uplink_tap=chat.uplink if chat else None,
        owns=owns,
        listening_by_default=False,
    )
    cluster = Cluster(settings.gateway_id, enabled=settings.cluster.enabled, udp=xiaozhi)
    owns.cluster = cluster
    board.owns = cluster.owns
    tasks = TaskService(
        catalog=loaded.catalog,
        config=RuntimeConfig.from_settings(settings.runtime),
        read_text=resource_reader(settings.runtime.resource_dir),
        # Scale-out: a command leaves once the store has the step it follows (durable.py).
        commands=DurableCommands(bridge, parts.store) if settings.cluster.enabled else bridge,
        mic=xiaozhi,
        recorder=recorder,
        assessment=assessment,
        load_running=recorder.load_running,
        modes=chat,
        owns=cluster.owns,
        handover_delay_s=settings.cluster.handover_delay_s,
    )
    bridge.tasks = tasks
    board.sink = bridge
    voice.tasks = tasks
    assessment.on_text = tasks.on_asr_text
    cluster.on_change(tasks.on_owners_changed)
    cluster.on_change(board.release_unowned)
    components: list[Component] = [*parts.components, cluster, board, xiaozhi, assessment, tasks]
    if chat is not None:
        chat.channel = xiaozhi
        if settings.chat.voice_task:
            app_id, task_id, lesson_id = settings.chat.voice_task.split("/")
            chat.start_task = lambda dev: tasks.start_by_voice(dev, app_id, task_id, lesson_id)
        components.append(chat)
    service = Service(settings, components, ctx=ctx)
    return Gateway(service, tasks, board, xiaozhi, assessment, parts.store, chat)


def build_service(settings: Settings) -> Service:
    return build_gateway(settings).service
