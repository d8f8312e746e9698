"""The board simulator's behaviours through the real channel: playback control, preemption,
DOWNLOAD over real HTTP with size/sha256 checks, ENSURE_APP_DIRS per board session, app tasks."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from gateway.board.bridge import BoardCommands, BoardToTasks
from gateway.board.model import AudioEventKind, BoardAppTask, BoardAudio, BoardReport, OutcomeKind
from gateway.tasks.core.events import AudioPhase, DeliveryResult, PlaybackEvent
from tests.integration.test_board_channel import WAIT_S, connected, gateway
from tests.support.broker import Broker, new_device_id
from topics.snlp_commands import (
    AudioPause,
    AudioResume,
    Download,
    PlayMedia,
    StartAppTask,
    StopMedia,
)

pytestmark = pytest.mark.integration


async def test_pause_resume_stop_and_preemption(broker: Broker, tmp_path: Path) -> None:
    async with gateway(broker, tmp_path) as rig:
        dev = new_device_id()
        sim = rig.simulator(dev, durations={"long.mp3": 60_000, "short.mp3": 300}, heartbeat_s=5.0)
        await connected(sim, rig)
        sink = rig.sink
        play = await asyncio.wait_for(rig.channel.send(dev, PlayMedia(name="long.mp3")), WAIT_S)
        await asyncio.wait_for(rig.channel.send(dev, AudioPause()), WAIT_S)
        await sink.wait_for(lambda: bool(sink.audio(dev, AudioEventKind.PAUSED, play.id)))
        await asyncio.wait_for(rig.channel.send(dev, AudioResume()), WAIT_S)
        await sink.wait_for(lambda: bool(sink.audio(dev, AudioEventKind.RESUMED, play.id)))
        await asyncio.wait_for(rig.channel.send(dev, StopMedia()), WAIT_S)
        await sink.wait_for(lambda: bool(sink.audio(dev, AudioEventKind.STOPPED, play.id)))
        (stopped,) = sink.audio(dev, AudioEventKind.STOPPED, play.id)
        assert isinstance(stopped.body, BoardAudio)
        assert stopped.body.reason == "stopped"
        assert stopped.body.name == "long.mp3"

        first = await asyncio.wait_for(rig.channel.send(dev, PlayMedia(name="long.mp3")), WAIT_S)
        second = await asyncio.wait_for(rig.channel.send(dev, PlayMedia(name="short.mp3")), WAIT_S)
        await sink.wait_for(lambda: bool(sink.audio(dev, AudioEventKind.COMPLETED, second.id)))
        (preempted,) = sink.audio(dev, AudioEventKind.COMPLETED, first.id)
        assert isinstance(preempted.body, BoardAudio)
        assert (preempted.body.reason, preempted.body.by) == ("preempted", second.id)
        (done,) = sink.audio(dev, AudioEventKind.COMPLETED, second.id)
        assert isinstance(done.body, BoardAudio)
        assert (done.body.reason, done.body.duration_ms) == ("eof", 300)


@pytest.fixture
async def http_files(tmp_path: Path) -> AsyncIterator[tuple[str, bytes]]:
    """A real HTTP server on localhost serving one resource."""
    body = bytes(range(256)) * 1024  # 256 KiB: several progress reports

    async def clip(_: web.Request) -> web.Response:
        return web.Response(body=body)

    app = web.Application()
    app.router.add_get("/res/clip.mp3", clip)
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/res/clip.mp3", body
    finally:
        await runner.cleanup()


async def test_download_to_sd_with_progress_and_checks(
    broker: Broker, tmp_path: Path, http_files: tuple[str, bytes]
) -> None:
    url, body = http_files
    sd = tmp_path / "sd"
    async with gateway(broker, tmp_path) as rig:
        dev = new_device_id()
        sim = rig.simulator(dev, sd_dir=sd, heartbeat_s=5.0)
        await connected(sim, rig)
        progress: list[BoardReport] = []
        sha = hashlib.sha256(body).hexdigest()
        params = Download(url=url, path="/english/u1/clip.mp3", size=len(body), sha256=sha)
        download = rig.channel.download(dev, params, on_progress=progress.append)
        final = await asyncio.wait_for(download.result, WAIT_S)
        assert (final.ok, final.bytes, final.sha256, final.code) == (True, len(body), sha, None)
        assert (await download.acked).kind is OutcomeKind.ACCEPTED
        assert progress
        assert all(p.stage == "progress" and p.total == len(body) for p in progress)
        assert (sd / "english/u1/clip.mp3").read_bytes() == body

        wrong = Download(url=url, path="/english/u1/x.mp3", size=len(body), sha256="0" * 64)
        final = await asyncio.wait_for(rig.channel.download(dev, wrong).result, WAIT_S)
        assert (final.ok, final.code) == (False, "SHA_MISMATCH")
        short = Download(url=url, path="/english/u1/y.mp3", size=1, sha256=sha)
        final = await asyncio.wait_for(rig.channel.download(dev, short).result, WAIT_S)
        assert (final.ok, final.code) == (False, "SIZE_MISMATCH")
        missing = Download(url=url + ".nope", path="/z.mp3", size=1, sha256=sha)
        final = await asyncio.wait_for(rig.channel.download(dev, missing).result, WAIT_S)
        assert (final.ok, final.code) == (False, "HTTP_404")
        assert not (sd / "english/u1/x.mp3").exists()


async def test_ensure_app_dirs_once_per_board_session(broker: Broker, tmp_path: Path) -> None:
    async with gateway(broker, tmp_path) as rig:
        dev = new_device_id()
        sim = rig.simulator(dev, heartbeat_s=5.0)
        await connected(sim, rig)

        def ensures() -> int:
            return sum(c["cmd"] == "ENSURE_APP_DIRS" for c in sim.received)

        for _ in range(3):
            outcome = await asyncio.wait_for(rig.channel.ensure_app_dirs(dev, "shadowing"), WAIT_S)
            assert outcome.delivered
        assert ensures() == 1
        sim.go_offline()  # LWT, then a new session
        await rig.sink.wait_for(lambda: rig.sink.online(dev) is False)
        sim.come_back()
        await rig.sink.wait_for(lambda: rig.sink.online(dev) is True)
        await asyncio.wait_for(rig.channel.ensure_app_dirs(dev, "shadowing"), WAIT_S)
        assert ensures() == 2

        await asyncio.wait_for(
            rig.channel.send(dev, StartAppTask(app="shadowing", task="u1")), WAIT_S
        )
        await rig.sink.wait_for(
            lambda: any(isinstance(e.body, BoardAppTask) for e in rig.sink.events)
        )
        (task_event,) = [e.body for e in rig.sink.events if isinstance(e.body, BoardAppTask)]
        assert (task_event.evt, task_event.state) == ("app_task.state", "started")


async def test_task_shell_port_end_to_end(broker: Broker, tmp_path: Path) -> None:
    """The runtime's CommandSender port over the real channel and a simulated board."""
    tasks = RecordingTasks()
    async with gateway(broker, tmp_path, also=BoardToTasks(tasks)) as rig:
        bridge = BoardCommands(rig.channel)
        dev = new_device_id()
        sim = rig.simulator(dev, durations={"lessons/u1/01.mp3": 300}, heartbeat_s=5.0)
        async with asyncio.timeout(WAIT_S):
            await sim.connected.wait()
            await tasks.seen.wait()
        outcomes: list[DeliveryResult] = []
        bridge.send_command(
            dev,
            command_id="rt-step-0",
            cmd="PLAY_MEDIA",
            params={"name": "lessons/u1/01.mp3"},
            prio=3,
            on_outcome=outcomes.append,
        )
        async with asyncio.timeout(WAIT_S):
            while not any(e.kind is AudioPhase.COMPLETED for _, e in tasks.events):
                tasks.seen.clear()
                await tasks.seen.wait()
        assert outcomes == [DeliveryResult.ACKED]
        done = next(e for _, e in tasks.events if e.kind is AudioPhase.COMPLETED)
        assert (done.ref, done.duration_ms, done.reason) == ("rt-step-0", 300, "eof")
        assert [online for d, online in tasks.presences if d == dev] == [True]


@dataclass
class RecordingTasks:
    events: list[tuple[str, PlaybackEvent]] = field(default_factory=list)
    presences: list[tuple[str, bool]] = field(default_factory=list)
    seen: asyncio.Event = field(default_factory=asyncio.Event)

    def board_event(self, device: str, event: PlaybackEvent) -> None:
        self.events.append((device, event))
        self.seen.set()

    def button(self, device: str, kind: str, key: str | None = None) -> None:
        self.seen.set()

    def presence(self, device: str, online: bool) -> None:
        self.presences.append((device, online))
        self.seen.set()
