"""The lesson sync job against a scripted board (the shell's decisions: retries, sha check,
SD space, one job per board); the real board and HTTP are in
tests/integration/test_lesson_content.py."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gateway.board.admin import BoardStatusView
from gateway.board.device import DownloadInFlight, ProgressCallback
from gateway.board.model import BoardReport, Outcome, OutcomeKind
from gateway.content import sync as sync_mod
from gateway.content.media import LessonMedia
from gateway.content.sync import LessonSync, SyncJob
from gateway.tasks.core import Catalog, ControlRefusal, TaskDef
from topics.snlp_commands import Download

DEV = "aa_bb_cc_dd_ee_01"
DATA = {"01.mp3": b"one" * 100, "02.mp3": b"two" * 100}


@dataclass
class NoRoutes:
    def add_route(self, *_: object, **__: object) -> None:
        pass


@dataclass
class ScriptedBoard:
    """Answers each DOWNLOAD with the next scripted final report code (None: ok)."""

    script: list[str | None] = field(default_factory=list)
    sd_free_mb: float | None = 100.0
    online: bool = True
    sent: list[Download] = field(default_factory=list)
    wrong_sha: bool = False

    def status_of(self, dev: str) -> BoardStatusView | None:
        return BoardStatusView(device=dev, online=self.online, sd_free_mb=self.sd_free_mb)

    def download(
        self, dev: str, params: Download, *, on_progress: ProgressCallback | None = None
    ) -> DownloadInFlight:
        self.sent.append(params)
        loop = asyncio.get_running_loop()
        acked: asyncio.Future[Outcome] = loop.create_future()
        result: asyncio.Future[BoardReport] = loop.create_future()
        code = self.script.pop(0) if self.script else None
        if on_progress is not None:
            on_progress(BoardReport("r", "DOWNLOAD", "progress", bytes=1, total=params.size))
        sha = "0" * 64 if self.wrong_sha else params.sha256
        result.set_result(
            BoardReport("r", "DOWNLOAD", "done", ok=code is None, code=code, sha256=sha)
        )
        return DownloadInFlight("r", acked, result)

    async def ensure_app_dirs(self, dev: str, app: str) -> Outcome:
        return Outcome("e", "ENSURE_APP_DIRS", OutcomeKind.ACCEPTED, 1)


@pytest.fixture
def media(tmp_path: Path) -> LessonMedia:
    task = TaskDef.model_validate(
        {
            "app_id": "app",
            "task_id": "t",
            "interaction_mode": "PLAY_AUDIO",
            "lessons": [{"lesson_id": "l1", "clips": list(DATA)}],
        }
    )
    for clip, data in DATA.items():
        target = tmp_path / "app/t/lessons/l1" / clip
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return LessonMedia(
        catalog=Catalog({task.key: task}),
        version=lambda: 1,
        resource_dir=tmp_path,
        base_url=lambda: "http://gw:8003",
        http=NoRoutes(),
        admin=None,
    )


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sync_mod, "RETRY_BASE_S", 0.0)


async def run_job(sync: LessonSync, lesson: str | None = "l1") -> SyncJob:
    async with asyncio.TaskGroup() as tg:
        runner = tg.create_task(sync.run())
        await asyncio.sleep(0)
        job = sync.start(DEV, "app", "t", lesson)
        assert isinstance(job, SyncJob)
        await job.finished.wait()
        runner.cancel()
    return job


async def test_a_cut_download_is_retried_and_changed_files_only(media: LessonMedia) -> None:
    board = ScriptedBoard(script=["board_offline", "not_delivered:expired"])
    sync = LessonSync(board=board, media=media)
    job = await run_job(sync)
    assert job.state == "done"
    assert [f.attempts for f in job.files] == [3, 1]
    assert [d.path for d in board.sent] == ["/app/t/lessons/l1/01.mp3"] * 3 + [
        "/app/t/lessons/l1/02.mp3"
    ]
    assert board.sent[0].sha256 == hashlib.sha256(DATA["01.mp3"]).hexdigest()
    assert board.sent[0].url == "http://gw:8003/media/app/t/l1/01.mp3"
    again = await run_job(sync)
    assert [f.state for f in again.files] == ["skipped", "skipped"]
    assert len(board.sent) == 4


async def test_a_board_error_or_wrong_sha_is_not_retried(media: LessonMedia) -> None:
    board = ScriptedBoard(script=["SD_WRITE"])
    job = await run_job(LessonSync(board=board, media=media))
    assert (job.state, job.reason) == ("failed", "file:/app/t/lessons/l1/01.mp3")
    assert (job.files[0].attempts, job.files[0].code) == (1, "SD_WRITE")
    board = ScriptedBoard(wrong_sha=True)
    job = await run_job(LessonSync(board=board, media=media))
    assert job.files[0].code == "sha_mismatch"
    assert len(board.sent) == 1


async def test_retries_end(media: LessonMedia) -> None:
    board = ScriptedBoard(script=["board_offline"] * sync_mod.ATTEMPTS)
    job = await run_job(LessonSync(board=board, media=media))
    assert job.state == "failed"
    assert job.files[0].attempts == sync_mod.ATTEMPTS


async def test_refusals_before_anything_is_sent(media: LessonMedia) -> None:
    board = ScriptedBoard(sd_free_mb=0.0001)
    job = await run_job(LessonSync(board=board, media=media))
    assert (job.state, job.reason) == ("refused", "sd_full")
    board = ScriptedBoard(online=False)
    job = await run_job(LessonSync(board=board, media=media))
    assert (job.state, job.reason) == ("refused", "device_offline")
    job = await run_job(LessonSync(board=ScriptedBoard(), media=media), lesson="nope")
    assert (job.state, job.reason) == ("refused", "unknown_lesson")
    board = ScriptedBoard(sd_free_mb=None)  # no heartbeat figure: not checked
    job = await run_job(LessonSync(board=board, media=media))
    assert job.state == "done"


async def test_one_job_per_board(media: LessonMedia) -> None:
    sync = LessonSync(board=ScriptedBoard(), media=media)
    assert sync.start(DEV, "app", "t", "l1") == "not_running"
    assert sync.from_ctl(DEV, "app", "t", "l1") == (
        ControlRefusal.OVERLOADED,
        "lesson sync: not_running",
    )
    async with asyncio.TaskGroup() as tg:
        runner = tg.create_task(sync.run())
        await asyncio.sleep(0)
        first = sync.start(DEV, "app", "t", "l1")
        assert isinstance(first, SyncJob)
        assert sync.start(DEV, "app", "t", "l1") is first  # the same lesson joins it
        assert sync.start(DEV, "app", "t", None) == "busy"
        assert sync.from_ctl(DEV, "app", "t", None) == (
            ControlRefusal.BUSY,
            "another lesson sync of this board runs",
        )
        await first.finished.wait()
        assert sync.from_ctl(DEV, "app", "t", None) is None
        runner.cancel()
