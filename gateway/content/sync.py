"""Lesson packs synced to boards' SD cards with DOWNLOAD (#28 item 5).

``LessonSync.start(dev, app, task, lesson)`` makes a job: the lesson's clips from the app
manifest (:mod:`gateway.content.media`: board path, URL on the device listener, sha256, size);
**only changed files** (a file this gateway already put on that board with the same sha256 is
skipped: the board has no listing command, so "what the board has" is what it confirmed to
this gateway since it started); **checked against the board's SD free space** (the last
heartbeat's ``sd_free_mb``; a job needing more is refused ``sd_full`` before anything is
sent); then ENSURE_APP_DIRS and one DOWNLOAD after another, each with progress (the board's
``rpt`` progress reports) and its final report's sha256 compared with the manifest's.

**A board that drops mid-file** ends that DOWNLOAD with ``board_offline``; the job tries the
file again (``ATTEMPTS`` times, backing off) once the board is back, and the board resumes it
from the bytes it has (an HTTP ``Range`` request to the media route; the simulator does so).

Bounded: one job per device at a time, ``MAX_JOBS`` jobs remembered (finished ones forgotten
oldest first; with that many running a new one is refused ``overloaded``); the synced-file
memory keeps ``MAX_DEVICES`` boards x ``MAX_FILES_PER_DEVICE`` paths. Jobs run in the
component's one TaskGroup.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict

from gateway.board.admin import BoardStatusView
from gateway.board.device import DownloadInFlight, ProgressCallback
from gateway.board.model import BoardReport, Outcome
from gateway.content.media import Clip, LessonMedia
from gateway.tasks.core import ControlRefusal
from topics.snlp_commands import Download

log = logging.getLogger(__name__)

MAX_JOBS = 1_024
MAX_DEVICES = 10_000
MAX_FILES_PER_DEVICE = 4_096
ATTEMPTS = 5  # per file: the first try and retries after a failed or cut download
RETRY_BASE_S = 0.5
RETRY_MAX_S = 8.0
RETRY_CODES = frozenset({"board_offline"})  # and every not_delivered:* outcome
MIB = 1024 * 1024

FileState = Literal["pending", "skipped", "downloading", "done", "failed"]
JobState = Literal["running", "done", "failed", "refused"]


class SyncBoard(Protocol):
    """The board channel as the sync uses it."""

    def status_of(self, dev: str) -> BoardStatusView | None: ...

    def download(
        self, dev: str, params: Download, *, on_progress: ProgressCallback | None = None
    ) -> DownloadInFlight: ...

    async def ensure_app_dirs(self, dev: str, app: str) -> Outcome: ...


class SyncFileView(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    size: int
    sha256: str
    state: FileState
    bytes: int
    attempts: int
    code: str | None = None


class SyncJobView(BaseModel):
    """A sync job: its state (``refused`` with ``reason``: nothing was sent) and every file."""

    model_config = ConfigDict(extra="forbid")

    device: str
    app_id: str
    task_id: str
    lesson_id: str | None
    state: JobState
    reason: str | None = None
    bytes_needed: int
    files: list[SyncFileView]
    started_at: float
    finished_at: float | None = None


@dataclass
class _File:
    clip: Clip
    url: str
    sha256: str
    size: int
    state: FileState = "pending"
    bytes: int = 0
    attempts: int = 0
    code: str | None = None


@dataclass
class SyncJob:
    device: str
    app_id: str
    task_id: str
    lesson_id: str | None
    files: list[_File] = field(default_factory=list)
    state: JobState = "running"
    reason: str | None = None
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    def view(self) -> SyncJobView:
        return SyncJobView(
            device=self.device,
            app_id=self.app_id,
            task_id=self.task_id,
            lesson_id=self.lesson_id,
            state=self.state,
            reason=self.reason,
            bytes_needed=sum(f.size for f in self.files if f.state != "skipped"),
            files=[
                SyncFileView(
                    path=f.clip.board_path,
                    size=f.size,
                    sha256=f.sha256,
                    state=f.state,
                    bytes=f.bytes,
                    attempts=f.attempts,
                    code=f.code,
                )
                for f in self.files
            ],
            started_at=self.started_at,
            finished_at=self.finished_at,
        )

    def end(self, state: JobState, reason: str | None = None) -> None:
        self.state, self.reason = state, reason
        self.finished_at = time.time()
        self.finished.set()


class LessonSync:
    name = "content-sync"

    def __init__(self, *, board: SyncBoard, media: LessonMedia) -> None:
        self._board = board
        self._media = media
        self._jobs: OrderedDict[str, SyncJob] = OrderedDict()  # device -> its latest job
        self._synced: OrderedDict[str, OrderedDict[str, str]] = OrderedDict()
        self._tg: asyncio.TaskGroup | None = None

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            try:
                await asyncio.Event().wait()  # jobs run in this group until the service stops
            finally:
                self._tg = None

    def job_of(self, dev: str) -> SyncJob | None:
        return self._jobs.get(dev)

    def start(self, dev: str, app_id: str, task_id: str, lesson_id: str | None) -> SyncJob | str:
        """A job started (or the device's running one, if it is for the same lesson), or why
        not: ``busy`` (another sync of the device runs), ``overloaded``, ``not_running``."""
        if self._tg is None:
            return "not_running"
        running = self._jobs.get(dev)
        if running is not None and running.state == "running":
            same = (running.app_id, running.task_id, running.lesson_id)
            return running if same == (app_id, task_id, lesson_id) else "busy"
        if dev not in self._jobs and len(self._jobs) >= MAX_JOBS:
            done = next((d for d, j in self._jobs.items() if j.state != "running"), None)
            if done is None:
                return "overloaded"
            del self._jobs[done]
        job = SyncJob(dev, app_id, task_id, lesson_id)
        self._jobs.pop(dev, None)
        self._jobs[dev] = job
        self._tg.create_task(self._run_job(job), name=f"content-sync[{dev}]")
        return job

    def from_ctl(
        self, dev: str, app_id: str, task_id: str, lesson_id: str | None
    ) -> tuple[ControlRefusal, str] | None:
        """The control topic's ``sync`` action: None when a job started (or the same one
        runs); the job's outcome is read with ``GET /admin/devices/{dev}/lesson/sync``."""
        job = self.start(dev, app_id, task_id, lesson_id)
        if isinstance(job, SyncJob):
            return None
        if job == "busy":
            return ControlRefusal.BUSY, "another lesson sync of this board runs"
        return ControlRefusal.OVERLOADED, f"lesson sync: {job}"

    async def _run_job(self, job: SyncJob) -> None:
        try:
            await self._sync(job)
        except Exception:
            log.exception("lesson sync for %s failed", job.device)
            job.end("failed", "internal")

    async def _sync(self, job: SyncJob) -> None:
        reason = await self._prepare(job)
        if reason is not None:
            job.end("refused", reason)
            return
        if all(f.state == "skipped" for f in job.files):
            job.end("done")
            return
        outcome = await self._board.ensure_app_dirs(job.device, job.app_id)
        if not outcome.delivered:
            job.end("failed", f"ensure_app_dirs:{outcome.kind.value}")
            return
        for f in job.files:
            if f.state == "pending" and not await self._download(job, f):
                job.end("failed", f"file:{f.clip.board_path}")
                return
        job.end("done")

    async def _prepare(self, job: SyncJob) -> str | None:
        """The job's files, changed ones ``pending``; or why nothing is sent."""
        clips = list(self._media.clips(job.app_id, job.task_id, job.lesson_id))
        if not clips:
            return "unknown_lesson"
        missing = [c.board_path for c in clips if self._media.file_of(c) is None]
        if missing:
            return f"missing_files:{len(missing)}"
        job.files = await asyncio.to_thread(self._files, clips)
        status = self._board.status_of(job.device)
        if status is None or not status.online:
            return "device_offline"
        synced: OrderedDict[str, str] = self._synced.get(job.device) or OrderedDict()
        for f in job.files:
            if synced.get(f.clip.board_path) == f.sha256:
                f.state = "skipped"
        needed = sum(f.size for f in job.files if f.state == "pending")
        if status.sd_free_mb is not None and needed > status.sd_free_mb * MIB:
            return "sd_full"
        return None

    def _files(self, clips: list[Clip]) -> list[_File]:
        out = []
        for clip in clips:
            path = self._media.file_of(clip)
            if path is None:  # removed since: reported as a failed file
                out.append(_File(clip, self._media.url_of(clip), "0" * 64, 0, "failed"))
                continue
            sha, size = self._media.sha256_of(path)
            out.append(_File(clip, self._media.url_of(clip), sha, size))
        return out

    async def _download(self, job: SyncJob, f: _File) -> bool:
        params = Download(
            url=f.url, path=f.clip.board_path, size=f.size, sha256=f.sha256, overwrite=True
        )

        def progress(report: BoardReport) -> None:
            if report.bytes is not None:
                f.bytes = min(report.bytes, f.size)

        for attempt in range(ATTEMPTS):
            f.state, f.attempts = "downloading", attempt + 1
            report = await self._board.download(job.device, params, on_progress=progress).result
            if report.ok and report.sha256 in (None, f.sha256):
                f.state, f.bytes, f.code = "done", f.size, None
                self._remember(job.device, f.clip.board_path, f.sha256)
                return True
            f.code = report.code or ("sha_mismatch" if report.ok else "failed")
            retry = f.code in RETRY_CODES or f.code.startswith("not_delivered")
            log.info(
                "sync %s: %s attempt %d: %s", job.device, f.clip.board_path, attempt + 1, f.code
            )
            if not retry or attempt + 1 == ATTEMPTS:
                break
            await asyncio.sleep(min(RETRY_MAX_S, RETRY_BASE_S * 2**attempt))
        f.state = "failed"
        return False

    def _remember(self, dev: str, path: str, sha: str) -> None:
        files = self._synced.pop(dev, None) or OrderedDict()
        self._synced[dev] = files
        while len(self._synced) > MAX_DEVICES:
            self._synced.popitem(last=False)
        files.pop(path, None)
        files[path] = sha
        while len(files) > MAX_FILES_PER_DEVICE:
            files.popitem(last=False)
