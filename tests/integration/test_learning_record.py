"""The learning record's archive on real stores: SQLite or PostgreSQL (a throw-away server),
the filesystem or S3 (moto's S3-compatible HTTP server), real speech (espeak-ng, libopus like
the device): archive → the Ogg file decodes with opusdec to the packets' duration; a signed
link; the quota; forget leaves nothing of the device anywhere; retention erases what is old.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import wave
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gateway.archive import AnswerArchive, FileBlobs, LinkCheck, S3Blobs, check_audio_link
from gateway.archive.blobs import AudioBlobs
from gateway.archive.retention import DAY_MS
from gateway.metrics import Metrics
from gateway.settings import ArchiveSettings
from gateway.store import InstanceRecord, StepRecord, Store, StoredMetric
from gateway.store.dialect import connector_for
from gateway.store.store import wall_ms
from tests.support.opus_stream import encode_like_device
from tests.support.postgres import Postgres
from tests.support.s3_server import ACCESS_KEY, SECRET_KEY, S3Server, s3_server
from tests.support.speech import RATE, synthesize

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SECRET = "link-secret-for-tests"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


@pytest.fixture(scope="module")
def said() -> dict[str, list[bytes]]:
    """Two children's answers as the device encodes them (real speech)."""
    return {
        "a": encode_like_device(synthesize("Good morning.")),
        "b": encode_like_device(synthesize("How are you today?")),
    }


class Rig:
    def __init__(self, store: Store, archive: AnswerArchive, url: str, clock: list[int]) -> None:
        self.store, self.archive, self.url, self.clock = store, archive, url, clock

    def rows(self, device: str) -> dict[str, int]:
        """What the database holds of ``device``, read with a connection of our own."""
        queries = {
            "instances": "SELECT COUNT(*) FROM instances WHERE device = ?",
            "steps": "SELECT COUNT(*) FROM steps WHERE instance_id LIKE ?",
            "audio": "SELECT COUNT(*) FROM audio WHERE device = ?",
        }
        params = {"instances": device, "steps": f"{device}-%", "audio": device}
        out = {}
        if self.url.startswith("sqlite"):
            with contextlib.closing(sqlite3.connect(self.url.removeprefix("sqlite:///"))) as db:
                for name, sql in queries.items():
                    out[name] = db.execute(sql, (params[name],)).fetchone()[0]
        else:
            with psycopg.connect(self.url) as db:
                for name, sql in queries.items():
                    row = db.execute(sql.replace("?", "%s"), (params[name],)).fetchone()
                    out[name] = row[0] if row else -1
        return out


@contextlib.asynccontextmanager
async def rig(url: str, blobs: AudioBlobs, **settings: Any) -> AsyncIterator[Rig]:
    clock = [wall_ms()]
    store = Store(connect=connector_for(url, Path("unused")), metrics=Metrics(), linger_s=0)
    archive = AnswerArchive(
        settings=ArchiveSettings(link_secret=SECRET, **settings),
        store=store,
        blobs=blobs,
        metrics=Metrics(),
        clock_ms=lambda: clock[0],
    )
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(store.run()), tg.create_task(archive.run())]
        try:
            yield Rig(store, archive, url, clock)
        finally:
            for task in tasks:
                task.cancel()


async def lesson_rows(store: Store, device: str, steps: int) -> str:
    """An instance of ``device`` with ``steps`` assessed steps (transcripts and metrics)."""
    instance_id = f"{device}-i1"
    await store.upsert_instance(InstanceRecord(instance_id, device_id=device, state=None))
    for i in range(steps):
        await store.upsert_step(
            StepRecord(
                instance_id,
                i,
                expected_text="Good morning.",
                asr_text="good morning",
                metrics=(StoredMetric("text_similarity_v0", 0.9),),
            )
        )
    return instance_id


def decoded_ms(data: bytes, tmp_path: Path) -> float:
    """The duration opusdec (opus-tools, an independent decoder) decodes ``data`` to."""
    src, out = tmp_path / "answer.opus", tmp_path / "answer.wav"
    src.write_bytes(data)
    subprocess.run(
        ["opusdec", "--quiet", "--rate", str(RATE), str(src), str(out)],
        check=True,
        capture_output=True,
    )
    with wave.open(str(out)) as wav:
        return float(wav.getnframes() * 1000 / wav.getframerate())


@pytest.fixture(params=["sqlite+files", "postgresql+s3"])
def where(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, AudioBlobs, S3Server | None]]:
    if request.param == "sqlite+files":
        yield f"sqlite:///{tmp_path / 'gw.sqlite3'}", FileBlobs(tmp_path / "audio"), None
        return
    postgres: Postgres = request.getfixturevalue("postgres")
    s3: S3Server = request.getfixturevalue("s3")
    blobs = S3Blobs(
        endpoint_url=s3.url,
        bucket=s3.new_bucket_name(),
        region="us-east-1",
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
    )
    yield postgres.new_database(), blobs, s3


async def test_archive_link_forget_and_retention(
    where: tuple[str, AudioBlobs, S3Server | None],
    said: dict[str, list[bytes]],
    tmp_path: Path,
) -> None:
    url, blobs, _ = where
    async with rig(url, blobs) as r:
        inst_a = await lesson_rows(r.store, "dev_a", 2)
        inst_b = await lesson_rows(r.store, "dev_b", 1)
        r.archive.submit(device="dev_a", instance_id=inst_a, step_index=0, packets=said["a"])
        r.archive.submit(device="dev_a", instance_id=inst_a, step_index=1, packets=said["b"])
        r.archive.submit(device="dev_b", instance_id=inst_b, step_index=0, packets=said["a"])
        await r.archive.drained()
        await r.store.flush()

        # Each answer: on the step row, its packets back as sent, opusdec decodes it whole.
        found = await r.store.get_instance(inst_a)
        assert found is not None
        ids = [s.audio_id for s in found[1]]
        assert all(ids)
        assert len(set(ids)) == 2
        for audio_id, packets in zip(ids, (said["a"], said["b"]), strict=True):
            assert audio_id is not None
            assert await r.archive.packets(audio_id) == tuple(packets)
            assert decoded_ms(await r.archive.get(audio_id), tmp_path) == 60.0 * len(packets)
            row = await r.archive.audio_of_step(inst_a, ids.index(audio_id))
            assert row is not None
            assert (row.audio_id, row.device, row.duration_ms) == (
                audio_id,
                "dev_a",
                60 * len(packets),
            )
        row_b = await r.archive.audio_of_step(inst_b, 0)
        assert row_b is not None
        assert sorted(blobs.ids()) == sorted([*map(str, ids), row_b.audio_id])
        link = r.archive.link(row_b.audio_id)
        now = r.clock[0]
        check = check_audio_link(
            SECRET.encode(), link.audio_id, str(link.expires_ms), link.signature, now_ms=now
        )
        assert check is LinkCheck.OK

        # Forget dev_a: nothing of it remains in the database or the blob store; dev_b stays.
        report = await r.archive.forget("dev_a")
        assert (report.instances, report.steps, report.audio, report.blobs) == (1, 2, 2, 2)
        assert r.rows("dev_a") == {"instances": 0, "steps": 0, "audio": 0}
        assert r.rows("dev_b") == {"instances": 1, "steps": 1, "audio": 1}
        left = blobs.ids()
        assert not set(left) & {str(i) for i in ids}
        assert len(left) == 1

        # Retention: within 30 days nothing goes; past it, dev_b's answer goes, its step stays.
        assert await r.archive.sweep(now + 29 * DAY_MS) == 0
        assert await r.archive.sweep(now + 31 * DAY_MS) == 1
        assert blobs.ids() == []
        assert r.rows("dev_b") == {"instances": 1, "steps": 1, "audio": 0}
        await r.store.flush()
        stored_b = await r.store.get_instance(inst_b)
        assert stored_b is not None
        assert stored_b[1][0].audio_id is None
        assert stored_b[1][0].asr_text == "good morning"  # the transcript is the store's


async def test_the_quota_keeps_a_devices_newest_answers(
    said: dict[str, list[bytes]], tmp_path: Path
) -> None:
    blobs = FileBlobs(tmp_path / "audio")
    url = f"sqlite:///{tmp_path / 'gw.sqlite3'}"
    async with rig(url, blobs) as r:
        inst = await lesson_rows(r.store, "dev_q", 1)
        r.archive.submit(device="dev_q", instance_id=inst, step_index=0, packets=said["a"])
        await r.archive.drained()
        first = await r.archive.audio_of_step(inst, 0)
        assert first is not None
    # The same gateway with a quota of 2.5 answers of that size: the oldest of 4 go.
    quota_mb = first.size_bytes * 2.5 / 1_000_000
    async with rig(url, blobs, device_quota_mb=quota_mb) as r:
        for step in (1, 2, 3):
            r.clock[0] += 1000
            r.archive.submit(device="dev_q", instance_id=inst, step_index=step, packets=said["a"])
            await r.archive.drained()
        kept = {step: await r.archive.audio_of_step(inst, step) is not None for step in range(4)}
        assert kept == {0: False, 1: False, 2: True, 3: True}
        assert len(blobs.ids()) == 2
