"""The console's adapters over the archive, the lesson media, the board and Xiaozhi status and
the lesson sync (gateway/console/seams.py), with small fakes in their Protocols' shapes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from gateway.archive.blobs import BlobMissing
from gateway.board.admin import BoardStatusView
from gateway.console.seams import ArchiveRecordings, LessonChoice, MediaContent, StatusFacts
from gateway.content.media import AppManifest, Clip
from gateway.content.sync import SyncJob
from gateway.store.records import ArchivedAudio
from gateway.tasks.core import Catalog, LessonDef, TaskDef
from gateway.xiaozhi.status import DeviceStatus, ToolSummary

DEV = "aa_bb_cc_dd_ee_01"
OTHER = "aa_bb_cc_dd_ee_02"
AUDIO = "ab" * 32
NOW_MS = 1_700_000_000_000


class _Archive:
    def __init__(self, fail: Exception | None = None) -> None:
        self.fail = fail

    async def audio_of_step(self, instance_id: str, step_index: int) -> ArchivedAudio | None:
        if step_index != 0:
            return None
        return ArchivedAudio(AUDIO, DEV, instance_id, 0, NOW_MS, 10, 900)

    async def get(self, audio_id: str) -> bytes:
        if self.fail is not None:
            raise self.fail
        return b"OggS..."


class _Media:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.task = TaskDef.model_validate(
            {"app_id": "app", "task_id": "t", "interaction_mode": "SHADOWING",
             "lessons": [{"lesson_id": "l1", "clips": ["01.mp3", "02.mp3"],
                          "sentences": ["a", "b"]}]}
        )  # fmt: skip

    def clips(
        self, app_id: str, task_id: str | None = None, lesson_id: str | None = None
    ) -> Iterator[Clip]:
        lesson: LessonDef = self.task.lessons[0]
        if (app_id, task_id, lesson_id) == ("app", "t", "l1"):
            yield from (Clip(self.task, lesson, c) for c in lesson.clips)

    def file_of(self, clip: Clip) -> Path | None:
        path = self.root / clip.clip
        return path if path.is_file() else None

    def build_manifest(self, app_id: str) -> AppManifest | None:
        if app_id != "app":
            return None
        return AppManifest(app_id="app", name="App", default_task="t", catalog_version=1, tasks=[])


CLOCK = [NOW_MS]


def recordings(tmp_path: Path, archive: _Archive | None = None) -> ArchiveRecordings:
    CLOCK[0] = NOW_MS
    return ArchiveRecordings(
        archive or _Archive(),
        _Media(tmp_path),
        ttl_s=60,
        secret=b"k" * 32,
        clock_ms=lambda: CLOCK[0],
    )


async def test_a_recording_link_is_bound_to_its_device_and_expires(tmp_path: Path) -> None:
    links = recordings(tmp_path)
    url = await links.recording(DEV, "i1", 0)
    assert url is not None
    parts = urlsplit(url)
    assert parts.path == f"/child/{DEV}/audio/{AUDIO}"
    q = {k: v[0] for k, v in parse_qs(parts.query).items()}
    assert q["expires"] == str(NOW_MS + 60_000)
    assert await links.audio(DEV, AUDIO, q["expires"], q["sig"]) == b"OggS..."
    assert await links.audio(OTHER, AUDIO, q["expires"], q["sig"]) == 403  # moved: refused
    assert await links.audio(DEV, AUDIO, q["expires"], "0" * 64) == 403
    CLOCK[0] = NOW_MS + 60_000  # expired
    assert await links.audio(DEV, AUDIO, q["expires"], q["sig"]) == 403


async def test_a_link_made_by_one_gateway_plays_on_another_with_the_same_secret(
    tmp_path: Path,
) -> None:
    """``archive.link_secret`` set alike on every gateway behind one balancer: a page from one
    gateway, its recording fetched from another (or after a restart); another secret: 403."""
    url = await recordings(tmp_path).recording(DEV, "i1", 0)
    assert url is not None
    q = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    restarted = recordings(tmp_path)  # a new instance: the same secret
    assert await restarted.audio(DEV, AUDIO, q["expires"], q["sig"]) == b"OggS..."
    other = ArchiveRecordings(_Archive(), None, ttl_s=60, secret=b"j" * 32, clock_ms=lambda: NOW_MS)
    assert await other.audio(DEV, AUDIO, q["expires"], q["sig"]) == 403


async def test_no_link_for_a_step_without_audio_or_of_another_device(tmp_path: Path) -> None:
    links = recordings(tmp_path)
    assert await links.recording(DEV, "i1", 1) is None
    assert await links.recording(OTHER, "i1", 0) is None  # the row is DEV's


@pytest.mark.parametrize(("fail", "status"), [(BlobMissing(AUDIO), 404), (OSError(), 503)])
async def test_a_recording_gone_or_unreadable_is_a_status(
    tmp_path: Path, fail: Exception, status: int
) -> None:
    links = recordings(tmp_path, _Archive(fail))
    url = await links.recording(DEV, "i1", 0)
    assert url is not None
    q = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    assert await links.audio(DEV, AUDIO, q["expires"], q["sig"]) == status


def test_reference_clips_only_the_catalog_names_with_a_file(tmp_path: Path) -> None:
    (tmp_path / "01.mp3").write_bytes(b"ID3")
    (tmp_path / "notes.txt").write_text("x")
    links = recordings(tmp_path)
    assert links.reference("app", "t", "l1", "01.mp3") == "/clip/app/t/l1/01.mp3"
    assert links.clip_file("app", "t", "l1", "01.mp3") == tmp_path / "01.mp3"
    assert links.reference("app", "t", "l1", "02.mp3") is None  # named, no file
    assert links.clip_file("app", "t", "l1", "notes.txt") is None  # a file, not named
    assert links.reference("app", "t", "l1", "") is None
    assert (
        ArchiveRecordings(_Archive(), None, ttl_s=1).clip_file("app", "t", "l1", "01.mp3") is None
    )


def test_status_facts_from_the_board_and_the_xiaozhi_status() -> None:
    board = BoardStatusView(
        device=DEV, online=True, fw="1.2.3", rssi=-61, heap=81920, sd_free_mb=512.5,
        heartbeat_age_s=2.0,
    )  # fmt: skip
    xz = DeviceStatus(
        features=(("aec", False), ("mcp", True)),
        hello_at=(NOW_MS - 60_000) / 1000,
        tools=(ToolSummary("self.audio_speaker.set_volume", "", ()),),
        tools_at=(NOW_MS - 50_000) / 1000,
    )
    facts = StatusFacts(
        {DEV: board}.get,
        {DEV: xz}.get,
        lambda d: ("board_offline",) if d == DEV else (),
        clock_ms=lambda: NOW_MS,
    )
    f = facts.facts(DEV)
    assert (f.online, f.firmware, f.rssi_dbm, f.heap, f.sd_free_mb) == (
        True, "1.2.3", -61, 81920, 512.5
    )  # fmt: skip
    assert f.last_seen_ms == NOW_MS - 2000  # the newest of heartbeat, hello, tools
    assert f.xiaozhi
    assert f.features == ("mcp",)
    assert f.mcp_tools == 1
    assert f.alarms == ("board_offline",)
    unknown = facts.facts(OTHER)
    assert unknown.online is None
    assert unknown.firmware is None
    assert unknown.last_seen_ms is None
    assert not unknown.xiaozhi
    assert unknown.mcp_tools is None
    # A Xiaozhi device heard (hello) but no tools/list answer yet; no board heartbeat yet.
    hello_only = StatusFacts(
        lambda _d: BoardStatusView(device=DEV, online=False),
        lambda _d: DeviceStatus(features=(), hello_at=10.0),
    ).facts(DEV)
    assert hello_only.mcp_tools is None
    assert hello_only.last_seen_ms == 10_000
    assert hello_only.online is False


def test_a_xiaozhi_only_board_is_online_while_its_voice_session_is_open() -> None:
    """An SD-less Xiaozhi board sends no board presence: its open voice session says online."""
    open_sessions = {DEV}
    facts = StatusFacts(
        lambda _d: None,
        lambda d: DeviceStatus(features=(), hello_at=10.0) if d == DEV else None,
        voice_online=open_sessions.__contains__,
    )
    assert facts.facts(DEV).online is True
    open_sessions.clear()  # its session closed: heard before, offline now
    assert facts.facts(DEV).online is False
    assert facts.facts(OTHER).online is None  # never heard of: not reported
    # A board whose channel reads offline while its voice session is open is online.
    both = StatusFacts(
        lambda _d: BoardStatusView(device=DEV, online=False), voice_online={DEV}.__contains__
    )
    assert both.facts(DEV).online is True


class _Sync:
    def __init__(self) -> None:
        self.jobs: dict[str, SyncJob] = {}

    def job_of(self, dev: str) -> SyncJob | None:
        return self.jobs.get(dev)

    def start(self, dev: str, app_id: str, task_id: str, lesson_id: str | None) -> SyncJob | str:
        if dev == OTHER:
            return "busy"
        self.jobs[dev] = SyncJob(dev, app_id, task_id, lesson_id)
        return self.jobs[dev]


async def test_media_content_manifests_and_sync_jobs(tmp_path: Path) -> None:
    media = _Media(tmp_path)
    content = MediaContent(media, _Sync(), Catalog({("app", "t"): media.task}))
    assert content.apps() == ["app"]
    manifest = await content.manifest("app")
    assert manifest is not None
    assert manifest.name == "App"
    assert await content.manifest("nope") is None
    assert content.job(DEV) is None
    lesson = LessonChoice("app", "t", "l1", "T")
    view = content.start_sync(DEV, lesson)
    assert not isinstance(view, str)
    assert view.state == "running"
    assert view.lesson_id == "l1"
    assert content.job(DEV) == view
    assert content.start_sync(OTHER, lesson) == "busy"
