"""What the console reads and asks of the rest of the gateway: small Protocols, and the adapters
over what main has (docs/console.md, "Seams"):

* :class:`ResultsSource`: a device's lesson history, one lesson's steps and each lesson's
  behaviour signals: the store's ``instances`` and ``steps`` (:class:`StoreResults`; the
  signals through the results read model's ``run_signals``).
* :class:`RecordingLinks`: the child's recording of a step and the reference clip, both served
  on the console's listener: the archive's answers on the console's own short-lived links,
  bound to the device (:class:`ArchiveRecordings`), the clips the catalog names from the lesson
  media. Without the archive: :class:`NoRecordings`.
* :class:`LessonSteering`: start / pause / resume / stop on a device: the task runtime's inbox,
  the same path as the MQTT control topic (:class:`InboxSteering`).
* :class:`FleetFacts`: what is known of a device: the board channel's status (fw, rssi, heap,
  SD free, last heartbeat), a Xiaozhi device's hello features and MCP tools, its recent ops
  alarms (:class:`StatusFacts`).
* :class:`LessonContent`: app manifests (spec §14) and lesson sync jobs (:class:`MediaContent`).
* :class:`ActivationApprovals`: OTA activation codes waiting, and approving one: the OTA
  endpoint's trust book (:class:`OtaApprovals`), the same as ``POST /admin/devices/approve``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gateway.archive.blobs import BlobMissing
from gateway.archive.links import LinkCheck, check_audio_link, sign_audio_link
from gateway.board.admin import BoardStatusView
from gateway.content.media import AppManifest, Clip
from gateway.content.sync import SyncJob, SyncJobView
from gateway.store.records import ArchivedAudio, InstanceRecord, StepRecord
from gateway.store.results import RunSignals, run_signals
from gateway.store.store import Store
from gateway.tasks.core import Catalog, ControlAction, ControlRequest
from gateway.xiaozhi.ota.endpoint import OtaEndpoint
from gateway.xiaozhi.status import DeviceStatus as XiaozhiStatus

log = logging.getLogger(__name__)


class ResultsSource(Protocol):
    async def history(self, device: str, limit: int) -> list[InstanceRecord]:
        """The device's lessons, newest first."""
        ...

    async def lesson(self, instance_id: str) -> tuple[InstanceRecord, list[StepRecord]] | None: ...

    async def steps_done(self, instance_ids: list[str]) -> dict[str, int]:
        """Per lesson, how many of its steps the child finished (the progress plot's y)."""
        ...

    async def signals(self, instance_ids: list[str]) -> dict[str, RunSignals]:
        """Per lesson, its behaviour signals (lessons whose steps carry none are left out)."""
        ...


@dataclass(frozen=True)
class StoreResults:
    store: Store

    async def history(self, device: str, limit: int) -> list[InstanceRecord]:
        return await self.store.list_instances(device_id=device, limit=limit)

    async def lesson(self, instance_id: str) -> tuple[InstanceRecord, list[StepRecord]] | None:
        return await self.store.get_instance(instance_id)

    async def steps_done(self, instance_ids: list[str]) -> dict[str, int]:
        if not instance_ids:
            return {}
        marks = ", ".join("?" for _ in instance_ids)
        sql = (
            # a clip step is done when its clip completed; a STEPS step when it ran to its end
            "SELECT instance_id, SUM(CASE WHEN completed_ms IS NOT NULL OR step_completed = 1 "  # noqa: S608  # placeholders only
            "THEN 1 ELSE 0 END) FROM steps "
            f"WHERE instance_id IN ({marks}) GROUP BY instance_id"
        )
        rows = await self.store.call(lambda db: db.query(sql, instance_ids))
        return {str(iid): int(str(n)) for iid, n in rows}

    async def signals(self, instance_ids: list[str]) -> dict[str, RunSignals]:
        if not instance_ids:
            return {}
        steps = await self.store.call(lambda db: db.steps_of(instance_ids))
        by_run: dict[str, list[StepRecord]] = {}
        for step in steps:
            by_run.setdefault(step.instance_id, []).append(step)
        found = {iid: run_signals(rows) for iid, rows in by_run.items()}
        return {iid: sig for iid, sig in found.items() if sig is not None}


class RecordingLinks(Protocol):
    async def recording(self, device: str, instance_id: str, step_index: int) -> str | None:
        """A console URL (signed, short-lived) of the child's recording of that step, if any."""
        ...

    def reference(self, app_id: str, task_id: str, lesson_id: str, clip: str) -> str | None:
        """A console URL of the lesson's reference clip, if the catalog names it and it has a
        file."""
        ...

    async def audio(self, device: str, audio_id: str, expires: str, sig: str) -> bytes | int:
        """The recording's Ogg Opus bytes, or the HTTP status to answer (403, 404, 503)."""
        ...

    def clip_file(self, app_id: str, task_id: str, lesson_id: str, clip: str) -> Path | None: ...


class NoRecordings:
    async def recording(self, device: str, instance_id: str, step_index: int) -> str | None:
        return None

    def reference(self, app_id: str, task_id: str, lesson_id: str, clip: str) -> str | None:
        return None

    async def audio(self, device: str, audio_id: str, expires: str, sig: str) -> bytes | int:
        return 404

    def clip_file(self, app_id: str, task_id: str, lesson_id: str, clip: str) -> Path | None:
        return None


class AnswerReader(Protocol):
    """What the console reads of the archive (:class:`gateway.archive.AnswerArchive`)."""

    async def audio_of_step(self, instance_id: str, step_index: int) -> ArchivedAudio | None: ...

    async def get(self, audio_id: str) -> bytes: ...


class ClipFinder(Protocol):
    """What the console reads of the lesson media (:class:`gateway.content.media.LessonMedia`)."""

    def clips(
        self, app_id: str, task_id: str | None = None, lesson_id: str | None = None
    ) -> Iterator[Clip]: ...

    def file_of(self, clip: Clip) -> Path | None: ...


AUDIO_ROUTE = "/child/{dev}/audio/{audio_id}"
CLIP_ROUTE = "/clip/{app_id}/{task_id}/{lesson_id}/{clip}"


class ArchiveRecordings:
    """The child's recordings from the archive, on the console's own short-lived signed links.

    The console's listener serves them (the admin listener, where the archive's own links
    play, is loopback). A link is ``/child/{dev}/audio/{audio_id}?expires=&sig=``, signed with
    a key derived from the console's secret *and the device*: the page route checks the
    session may see ``{dev}`` (404 otherwise), the signature binds the recording to that
    device (a link moved to another device's URL fails: 403). Only a step of a lesson of that
    device gets a link (the lesson page checks the lesson is the device's).
    """

    def __init__(
        self,
        archive: AnswerReader,
        media: ClipFinder | None,
        *,
        ttl_s: int,
        secret: bytes | None = None,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self._archive = archive
        self._media = media
        self._ttl_s = ttl_s
        self._secret = secret or secrets.token_bytes(32)
        self._clock_ms = clock_ms

    def _key(self, device: str) -> bytes:
        return hmac.new(self._secret, f"console-audio:{device}".encode(), hashlib.sha256).digest()

    async def recording(self, device: str, instance_id: str, step_index: int) -> str | None:
        row = await self._archive.audio_of_step(instance_id, step_index)
        if row is None or row.device != device:
            return None
        link = sign_audio_link(
            self._key(device), row.audio_id, now_ms=self._clock_ms(), ttl_s=self._ttl_s
        )
        path = AUDIO_ROUTE.format(dev=device, audio_id=row.audio_id)
        return f"{path}?expires={link.expires_ms}&sig={link.signature}"

    async def audio(self, device: str, audio_id: str, expires: str, sig: str) -> bytes | int:
        verdict = check_audio_link(
            self._key(device), audio_id, expires, sig, now_ms=self._clock_ms()
        )
        if verdict is not LinkCheck.OK:
            return 403
        try:
            return await self._archive.get(audio_id)
        except BlobMissing:
            return 404
        except Exception as exc:  # the blob store is down: answered, never a crash
            log.warning("console: archive read failed: %s", type(exc).__name__)
            return 503

    def clip_file(self, app_id: str, task_id: str, lesson_id: str, clip: str) -> Path | None:
        """The file of a clip the catalog names (nothing else of the resource directory)."""
        if self._media is None:
            return None
        for found in self._media.clips(app_id, task_id, lesson_id):
            if found.clip == clip:
                return self._media.file_of(found)
        return None

    def reference(self, app_id: str, task_id: str, lesson_id: str, clip: str) -> str | None:
        if not clip or self.clip_file(app_id, task_id, lesson_id, clip) is None:
            return None
        return CLIP_ROUTE.format(app_id=app_id, task_id=task_id, lesson_id=lesson_id, clip=clip)


@dataclass(frozen=True, slots=True)
class LessonChoice:
    app_id: str
    task_id: str
    lesson_id: str
    title: str

    @property
    def key(self) -> str:
        return f"{self.app_id}/{self.task_id}/{self.lesson_id}"


def lesson_choices(catalog: Catalog) -> list[LessonChoice]:
    return sorted(
        (
            LessonChoice(t.app_id, t.task_id, lesson.lesson_id, t.title or t.task_id)
            for t in catalog
            for lesson in t.lessons
        ),
        key=lambda c: c.key,
    )


class LessonSteering(Protocol):
    def steer(
        self,
        device: str,
        action: ControlAction,
        *,
        priority: int,
        source: str,
        lesson: LessonChoice | None = None,
    ) -> bool:
        """Ask the task runtime; False when the request could not be queued."""
        ...


class ControlSink(Protocol):
    """The task inbox's control entry (:meth:`gateway.tasks.inbox.TaskInbox.put` is behind)."""

    def control(self, device: str, request: ControlRequest) -> None: ...


@dataclass
class InboxSteering:
    inbox: ControlSink

    def steer(
        self,
        device: str,
        action: ControlAction,
        *,
        priority: int,
        source: str,
        lesson: LessonChoice | None = None,
    ) -> bool:
        request = ControlRequest(
            action=action,
            request_id=f"console-{time.monotonic_ns():x}",
            app_id=lesson.app_id if lesson else None,
            task_id=lesson.task_id if lesson else None,
            lesson_id=lesson.lesson_id if lesson else None,
            priority=priority,
            source=source,
        )
        self.inbox.control(device, request)
        return True


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    device: str
    online: bool | None = None
    firmware: str | None = None
    rssi_dbm: int | None = None
    sd_free_mb: float | None = None
    heap: int | None = None
    last_seen_ms: int | None = None
    alarms: tuple[str, ...] = ()
    xiaozhi: bool = False  # a Xiaozhi device the gateway has heard a hello from
    features: tuple[str, ...] = ()  # its hello features that are on
    mcp_tools: int | None = None  # MCP tools it listed; None: no tools/list answer yet


class FleetFacts(Protocol):
    def facts(self, device: str) -> DeviceFacts: ...


@dataclass(frozen=True)
class BoardFacts:
    """Online from the board channel, the device's recent ops alarms; nothing else."""

    is_online: Callable[[str], bool]
    alarms: Callable[[str], tuple[str, ...]] = lambda _device: ()

    def facts(self, device: str) -> DeviceFacts:
        return DeviceFacts(device, online=self.is_online(device), alarms=self.alarms(device))


@dataclass(frozen=True)
class StatusFacts:
    """The board channel's status of a board (its last heartbeat: fw, rssi, heap, SD free)
    and, for a Xiaozhi device, its hello features and MCP tools; the recent ops alarms.

    Online: a board channel that reads online, or an open Xiaozhi voice session
    (``voice_online``): a Xiaozhi-only board without an SD card never sends board presence, and
    it is online while its session is open."""

    status_of: Callable[[str], BoardStatusView | None]
    xiaozhi_of: Callable[[str], XiaozhiStatus | None] = lambda _device: None
    alarms: Callable[[str], tuple[str, ...]] = lambda _device: ()
    clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)
    voice_online: Callable[[str], bool] = lambda _device: False

    def facts(self, device: str) -> DeviceFacts:
        board = self.status_of(device)
        xz = self.xiaozhi_of(device)
        seen: list[int] = []
        if board is not None and board.heartbeat_age_s is not None:
            seen.append(self.clock_ms() - int(board.heartbeat_age_s * 1000))
        if xz is not None:
            seen += [int(at * 1000) for at in (xz.hello_at, xz.tools_at) if at is not None]
        online: bool | None = board.online if board is not None else None
        if self.voice_online(device):
            online = True
        elif online is None and xz is not None:
            online = False  # heard once (hello), no session open now, no board channel
        return DeviceFacts(
            device,
            online=online,
            firmware=board.fw if board is not None else None,
            rssi_dbm=board.rssi if board is not None else None,
            sd_free_mb=board.sd_free_mb if board is not None else None,
            heap=board.heap if board is not None else None,
            last_seen_ms=max(seen) if seen else None,
            alarms=self.alarms(device),
            xiaozhi=xz is not None,
            features=tuple(name for name, on in xz.features if on) if xz is not None else (),
            mcp_tools=len(xz.tools) if xz is not None and xz.tools_at is not None else None,
        )


class LessonContent(Protocol):
    """Lesson content per app (the manifest, spec §14) and syncing a lesson to a board."""

    def apps(self) -> list[str]: ...

    async def manifest(self, app_id: str) -> AppManifest | None: ...

    def start_sync(self, device: str, lesson: LessonChoice) -> SyncJobView | str:
        """The job started (or the same one running), or why not (busy, not_running, ...)."""
        ...

    def job(self, device: str) -> SyncJobView | None: ...


class NoContent:
    def apps(self) -> list[str]:
        return []

    async def manifest(self, app_id: str) -> AppManifest | None:
        return None

    def start_sync(self, device: str, lesson: LessonChoice) -> SyncJobView | str:
        return "not_running"

    def job(self, device: str) -> SyncJobView | None:
        return None


class ManifestBuilder(Protocol):
    def build_manifest(self, app_id: str) -> AppManifest | None: ...


class LessonFiles(ClipFinder, ManifestBuilder, Protocol):
    """The lesson media (:class:`gateway.content.media.LessonMedia`): clips and manifests."""


class SyncJobs(Protocol):
    def job_of(self, dev: str) -> SyncJob | None: ...

    def start(
        self, dev: str, app_id: str, task_id: str, lesson_id: str | None
    ) -> SyncJob | str: ...


@dataclass(frozen=True)
class MediaContent:
    """The lesson media's manifests (hashed in a thread) and the lesson sync's jobs."""

    media: ManifestBuilder
    sync: SyncJobs
    catalog: Catalog

    def apps(self) -> list[str]:
        return sorted({t.app_id for t in self.catalog})

    async def manifest(self, app_id: str) -> AppManifest | None:
        return await asyncio.to_thread(self.media.build_manifest, app_id)

    def start_sync(self, device: str, lesson: LessonChoice) -> SyncJobView | str:
        job = self.sync.start(device, lesson.app_id, lesson.task_id, lesson.lesson_id)
        return job if isinstance(job, str) else job.view()

    def job(self, device: str) -> SyncJobView | None:
        job = self.sync.job_of(device)
        return None if job is None else job.view()


@dataclass(frozen=True, slots=True)
class WaitingCode:
    code: str
    device: str
    expires_in_s: float


class ActivationApprovals(Protocol):
    enabled: bool

    def waiting(self) -> list[WaitingCode]: ...

    def devices(self) -> Iterable[str]:
        """Devices bound through OTA (the fleet's rows beside the granted ones)."""
        ...

    async def approve(self, code: str) -> tuple[bool, str]:
        """(approved, outcome: approved | unknown | locked | unsaved)."""
        ...


class OtaApprovals:
    def __init__(self, ota: OtaEndpoint | None) -> None:
        self._ota = ota
        self.enabled = ota is not None

    def waiting(self) -> list[WaitingCode]:
        if self._ota is None:
            return []
        now = self._ota.clock()
        return [
            WaitingCode(p.code, p.dev, round(p.expires - now, 1))
            for p in self._ota.book.pending(now)
        ]

    def devices(self) -> Iterable[str]:
        return [] if self._ota is None else sorted(self._ota.book.bindings)

    async def approve(self, code: str) -> tuple[bool, str]:
        if self._ota is None:
            return False, "unknown"
        outcome, pending = self._ota.book.approve(code, self._ota.clock())
        self._ota.stats.approvals.labels(outcome.value).inc()
        if pending is None:
            return False, outcome.value
        try:
            await self._ota.persist()
        except Exception:
            log.exception("saving OTA bindings failed")
            return True, "unsaved"
        log.info("console: %s approved for a new Client-Id", pending.dev)
        return True, outcome.value
