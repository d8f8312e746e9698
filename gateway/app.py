"""Composition root: which components a production gateway runs, and how they are connected.

Built in one phase (docs/architecture.md): the shared :class:`Context` first, then the task
inbox (so its producers need no reference to the task service), then each component ONCE with
its collaborators passed in; the :class:`Service` only runs them. Channels and the task runtime
keep their own types; the adapters between them are the board channel's ``BoardToTasks`` /
``BoardCommands`` and :class:`VoiceToTasks` below.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.archive import AnswerArchive, build_archive
from gateway.assessment.catchup import CatchUp
from gateway.assessment.engine import Backend
from gateway.assessment.path import AssessmentPath
from gateway.board import BoardChannel
from gateway.board.admin import BoardStatusAdmin
from gateway.board.bridge import BoardCommands, BoardToTasks
from gateway.chat.component import ChatComponent
from gateway.cluster import Cluster, Ownership
from gateway.console import Console, build_console
from gateway.content.admin import SyncAdmin
from gateway.content.media import LessonMedia
from gateway.content.sync import LessonSync
from gateway.service import Component, Context, Service
from gateway.settings import Settings
from gateway.speech.phrases import catalog_phrases
from gateway.speech.sdless import SdlessCommands, SdlessEvents, SessionFanout
from gateway.speech.service import SpeechService
from gateway.speech.target import XiaozhiDownlink
from gateway.store import ResultsApi, Store, build_store_components
from gateway.tasks.admin import LessonAdmin
from gateway.tasks.catalog_admin import CatalogAdmin
from gateway.tasks.catalog_live import LiveCatalog
from gateway.tasks.core import RuntimeConfig, resource_reader
from gateway.tasks.core.admission import AdmissionConfig
from gateway.tasks.durable import DurableCommands
from gateway.tasks.inbox import TaskInbox
from gateway.tasks.records import StoreRecorder
from gateway.tasks.service import TaskService
from gateway.xiaozhi import XiaozhiChannel, utterance_id
from gateway.xiaozhi.tasks_json import XiaozhiTaskTeller

log = logging.getLogger(__name__)

# How much longer than the admission line's longest wait the admin API waits for a reply.
LESSON_REPLY_MARGIN_S = 10.0


@dataclass(frozen=True)
class VoiceToTasks:
    """The Xiaozhi channel's ``VoiceSink`` feeding the task runtime's inbox."""

    inbox: TaskInbox

    def speech_started(self, dev: str, session_id: str, at_ms: float) -> None:
        self.inbox.speech_started(dev, utterance_id(session_id, at_ms))

    def speech_stopped(
        self,
        dev: str,
        session_id: str,
        pcm: bytes,
        start_ms: float,
        end_ms: float,
        *,
        packets: Sequence[bytes] = (),
    ) -> None:
        uid = utterance_id(session_id, start_ms)
        self.inbox.speech_stopped(dev, uid, pcm, int(end_ms - start_ms), tuple(packets))


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
    archive: AnswerArchive | None = None
    speech: SpeechService | None = None
    content_sync: LessonSync | None = None
    console: Console | None = None


def prepare_phrases(speech: SpeechService, catalog: LiveCatalog) -> None:
    """The catalog's fixed phrases synthesized ahead of use (in the background, once SPEAK
    runs), and again after each catalog reload."""

    def prepare() -> None:
        speech.prepare(catalog_phrases(catalog, speech.engine.voices()))

    prepare()
    catalog.add_swap_listener(prepare)


def build_gateway(settings: Settings, *, asr_backend: Backend | None = None) -> Gateway:
    """The production composition; ``asr_backend`` overrides the configured ASR engine."""
    catalog, loaded = LiveCatalog.load(settings.runtime.catalog_path)
    for warning in loaded.warnings:
        log.warning("catalog: %s", warning)
    ctx = Context.create(settings)
    parts = build_store_components(ctx)
    recorder = StoreRecorder(parts.store)
    # Each step's answer as Ogg Opus when archive.enabled; forget and the sweeper always.
    archive = build_archive(ctx, parts.store)
    ResultsApi(  # routes only; each kept answer's audio on a signed link
        store=parts.store,
        admin=ctx.admin,
        audio_links=lambda audio_id: archive.link(audio_id).url,
    )
    inbox = TaskInbox(metrics=ctx.metrics)
    # Devices without an SD card (no board presence, a Xiaozhi session): lesson clips go over
    # the voice channel (docs/speech.md); board presence and SPEAK's results pass through it.
    sdless = SdlessEvents(
        tasks=inbox,
        max_boards=settings.board.max_devices,
        max_sessions=settings.xiaozhi.max_sessions,
    )
    # Scale-out: one owner per device over the live gateways (cluster.enabled; else all ours).
    ownership = Ownership(settings.gateway_id, enabled=settings.cluster.enabled)
    board = BoardChannel(
        settings=settings.board,
        router=ctx.mqtt,
        publisher=ctx.mqtt,
        metrics=ctx.metrics,
        alarms=ctx.ops,
        sink=BoardToTasks(sdless),
        owns=ownership.owns,
        max_devices=settings.board.max_devices,
        max_payload_bytes=settings.mqtt.max_payload_bytes,
    )
    BoardStatusAdmin(board.status_of, admin=ctx.admin)
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
            ctx=ctx,
            settings=settings.chat,
            inner=voice,
            asr=assessment,
            start_task=start_task,
            keeper=archive if settings.archive.enabled and settings.archive.chat_turns else None,
        )
    xiaozhi = XiaozhiChannel(
        settings=settings,
        mqtt=ctx.mqtt,
        metrics=ctx.metrics,
        http=ctx.http,
        admin=ctx.admin,
        voice=chat or voice,
        events=SessionFanout(chat, sdless),
        uplink_tap=chat.uplink if chat else None,
        owns=ownership.owns,
        listening_by_default=False,
    )
    speech = None
    if settings.speech.enabled:
        # SPEAK's started/completed/interrupted go to the task runtime (the task DSL).
        speech = SpeechService(
            settings=settings.speech,
            channel=XiaozhiDownlink(xiaozhi),
            sink=sdless,
            metrics=ctx.metrics,
        )
    cluster = Cluster(
        ctx=ctx,
        ownership=ownership,
        udp=xiaozhi,
        listeners=(inbox.owners_changed, board.release_unowned),
    )
    http_settings = settings.http
    media = LessonMedia(
        catalog=catalog,
        version=lambda: catalog.current.version,
        resource_dir=settings.runtime.resource_dir,
        # boards fetch from the device listener (the admin one is loopback, token-guarded)
        base_url=lambda: (
            http_settings.media_base_url or f"http://{http_settings.host}:{ctx.http.port}"
        ),
        http=ctx.http,
        admin=ctx.admin,
    )
    sync = LessonSync(board=board, media=media)
    SyncAdmin(sync, online=board.online_devices, admin=ctx.admin)
    commands = SdlessCommands(  # a voice-only device's commands answered there (PLAY_MEDIA…)
        board=BoardCommands(board),
        speech=speech,
        events=sdless,
        resource_dir=settings.runtime.resource_dir,
    )
    tasks = TaskService(
        ctx=ctx,
        inbox=inbox,
        catalog=catalog,
        config=RuntimeConfig.from_settings(settings.runtime),
        read_text=resource_reader(settings.runtime.resource_dir),
        # Scale-out: a command leaves once the store has the step it follows (durable.py).
        commands=DurableCommands(commands, parts.store) if settings.cluster.enabled else commands,
        mic=xiaozhi,
        recorder=recorder,
        assessment=assessment,
        load_running=recorder.load_running,
        modes=chat,
        archive=archive if settings.archive.enabled else None,
        devices=XiaozhiTaskTeller(xiaozhi),
        speaker=speech,
        inline=assessment,
        owns=ownership.owns,
        handover_delay_s=settings.cluster.handover_delay_s,
        admission=AdmissionConfig(
            rate_per_s=settings.runtime.start_rate_per_s,
            burst=settings.runtime.start_burst,
            max_wait_ms=settings.runtime.start_max_wait_s * 1000.0,
        ),
        sync=sync.from_ctl,
    )
    catalog.add_swap_listener(tasks.catalog_swapped)
    if speech is not None:
        prepare_phrases(speech, catalog)
    CatalogAdmin(catalog, admin=ctx.admin)
    # Lessons started/paused/resumed/stopped over the admin API: the control topic's path.
    LessonAdmin(
        control=tasks.control,
        owns=tasks.owns,
        admin=ctx.admin,
        reply_timeout_s=settings.runtime.start_max_wait_s + LESSON_REPLY_MARGIN_S,
    )
    # Answers shed under load are assessed from the archive while the ASR is idle.
    catch_up = CatchUp(
        path=assessment,
        store=parts.store,
        # its own thread, not the archive's: a slow read (S3) must not hold up new answers
        read_audio=lambda audio_id: asyncio.to_thread(archive.blobs.get, audio_id),
        plan=tasks.plan,
        owns=ownership.owns,
        calm=lambda: xiaozhi.overload.calm,
        settings=settings.asr,
        metrics=ctx.metrics,
    )
    components: list[Component] = [
        *parts.components,
        cluster,
        board,
        xiaozhi,
        assessment,
        catch_up,
        tasks,
        sync,
    ]
    if chat is not None:
        components.append(chat)
    components.append(archive)
    if speech is not None:
        components.append(speech)
    console = None
    if settings.console.enabled:
        console = build_console(
            ctx,
            store=parts.store,
            inbox=inbox,
            catalog=catalog,
            online=board.is_online,
            ota=xiaozhi.ota,
            archive=archive,
            media=media,
            sync=sync,
            board_status=board.status_of,
            xiaozhi_status=xiaozhi.control.status.get,
            voice_online=lambda dev: xiaozhi.session_id(dev) is not None,
        )
        components.append(console)
    service = Service(ctx, components)
    return Gateway(
        service=service,
        tasks=tasks,
        board=board,
        xiaozhi=xiaozhi,
        assessment=assessment,
        store=parts.store,
        chat=chat,
        archive=archive,
        speech=speech,
        content_sync=sync,
        console=console,
    )


def build_service(settings: Settings) -> Service:
    return build_gateway(settings).service
