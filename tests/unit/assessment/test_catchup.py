"""Catch-up assessment's shell: a real AssessmentPath and pool, a real SQLite store, real Ogg
Opus answers on files; the ASR engine is a scripted one on the loop (what it hears is set by
the test), the MQTT edge the fake publisher."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gateway.archive import FileBlobs, content_id, mux_ogg_opus
from gateway.assessment.catchup import CatchUp
from gateway.assessment.jobs import (
    AsrFailure,
    AsrJob,
    AsrKey,
    AsrResult,
    FailureReason,
    audio_ms,
)
from gateway.assessment.path import AssessmentPath, OnLate
from gateway.http import HttpServer
from gateway.metrics import Metrics
from gateway.service import Context, Ops
from gateway.settings import AsrSettings, load_settings
from gateway.store import InstanceRecord, StepRecord, Store
from gateway.store.records import ArchivedAudio
from tests.support.fake_mqtt import FakePublisher
from tests.support.opus_stream import encode_like_device
from tests.support.speech import silence
from tests.unit.store.test_store import running

DEV, OTHER = "aa_bb_cc_dd_ee_07", "aa_bb_cc_dd_ee_08"
SENTENCES = ("Good morning.", "How are you?", "Thank you.")
PLAN = (("text_similarity_v0",), SENTENCES)


@dataclass
class ScriptedEngine:
    """Hears ``said[n]`` in an answer of n samples (each test answer has its own length);
    ``gate`` cleared holds every job until set; ``fail`` answers with an engine error."""

    said: dict[int, str]
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    fail: bool = False
    started: asyncio.Event = field(default_factory=asyncio.Event)
    hints: list[tuple[str, ...]] = field(default_factory=list)
    name: str = "scripted"

    def __post_init__(self) -> None:
        self.gate.set()

    async def run(self, job: AsrJob, timeout_s: float) -> AsrResult | AsrFailure:
        self.started.set()
        self.hints.append(job.hints)
        await self.gate.wait()
        if self.fail:
            return AsrFailure(FailureReason.ENGINE_ERROR, "scripted")
        return AsrResult(self.said.get(len(job.pcm) // 2, ""), self.name, audio_ms(job.pcm), 1.0)

    # Slot and Backend in one (test engine)
    @property
    def healthy(self) -> bool:
        return True

    def close(self) -> None:
        return None

    async def open_slot(self) -> ScriptedEngine:
        return self

    async def aclose(self) -> None:
        return None


def answer(ms: int, serial: int) -> bytes:
    """An archived answer of ``ms`` (a multiple of 60): device-like Opus packets in Ogg."""
    return mux_ogg_opus(encode_like_device(silence(ms)), serial=serial)


@dataclass
class CatchUpRig:
    store: Store
    blobs: FileBlobs
    path: AssessmentPath
    mqtt: FakePublisher
    metrics: Metrics
    engine: ScriptedEngine
    catch_up: CatchUp
    calm: list[bool]
    owned: set[str]
    ids: dict[tuple[str, int], str] = field(default_factory=dict)  # (instance, step) → audio

    def outcomes(self) -> dict[str, float]:
        prefix = 'snlpgw_assessment_catch_up_total{outcome="'
        snap = self.metrics.snapshot()
        return {k[len(prefix) : -2]: v for k, v in snap.items() if k.startswith(prefix)}

    def published(self) -> list[dict[str, object]]:
        return [json.loads(p.payload) for p in self.mqtt.sent if "/assessment/" in p.topic]

    async def shed(self, device: str, iid: str, created: int, lengths: Sequence[int]) -> None:
        """An instance whose steps were all shed under load, each answer archived."""
        self.store.submit_instance(
            InstanceRecord(
                iid, device_id=device, app_id="english_learning", task_id="shadowing",
                lesson_id="unit01", created_ms=created,
            )
        )  # fmt: skip
        for k, ms in enumerate(lengths):
            data = answer(ms, serial=len(self.ids) + 1)
            audio_id = self.ids[(iid, k)] = content_id(data)
            self.blobs.put(audio_id, data)
            await self.store.add_audio(
                ArchivedAudio(audio_id, device, iid, k, created, len(data), ms)
            )
            self.store.submit_step(
                StepRecord(
                    iid, k, prompt_text=f"/a/t/lessons/unit01/0{k + 1}.mp3",
                    expected_text=SENTENCES[k], audio_id=audio_id, assessment_shed="asr_saturated",
                )
            )  # fmt: skip
        await self.store.flush()

    async def step(self, iid: str, k: int) -> StepRecord:
        found = await self.store.get_instance(iid)
        assert found is not None
        return {s.step_index: s for s in found[1]}[k]


@contextlib.asynccontextmanager
async def rig(tmp_path: Path, **asr: object) -> AsyncIterator[CatchUpRig]:
    metrics, mqtt = Metrics(), FakePublisher()
    http = HttpServer(host="127.0.0.1", port=0, metrics=metrics)
    ctx = Context(load_settings(), mqtt, http, metrics, Ops("gw", mqtt, metrics), http)  # type: ignore[arg-type]
    settings = AsrSettings(**{"engine": "pocketsphinx", "queue_limit": 1, **asr})
    store = Store(path=tmp_path / "gw.sqlite3")
    engine = ScriptedEngine({960 * 10: "good morning", 960 * 20: "i like apples"})
    path = AssessmentPath(
        ctx=ctx, settings=settings, store=store, on_text=lambda *a: None, backend=engine
    )
    blobs = FileBlobs(tmp_path / "audio")
    blobs.prepare()
    calm, owned = [True], {DEV, OTHER}
    catch_up = CatchUp(
        path=path, store=store, read_audio=lambda a: asyncio.to_thread(blobs.get, a),
        plan=lambda *lesson: PLAN, owns=owned.__contains__, calm=lambda: calm[0],
        settings=settings, metrics=metrics,
    )  # fmt: skip
    async with running(store), asyncio.TaskGroup() as tg:
        pool = tg.create_task(path.run(), name="test.asr")
        try:
            yield CatchUpRig(store, blobs, path, mqtt, metrics, engine, catch_up, calm, owned)
        finally:
            pool.cancel()


async def test_shed_answers_are_assessed_late_newest_lesson_first_and_published(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path) as r:
        await r.shed(DEV, "old", 100, [600])
        await r.shed(DEV, "new", 200, [600, 1200])
        assert await r.catch_up.catch_up() == 3
        order = [(m["instance_id"], m["step_index"]) for m in r.published()]
        assert order == [("new", 0), ("new", 1), ("old", 0)]
        first = r.published()[0]
        assert first["device"] == DEV
        assert first["asr_text"] == "good morning"
        assert first["metrics"] == [{"method": "text_similarity_v0", "value": 1.0}]
        assert first["clip"] == "01.mp3"
        assert r.engine.hints == [SENTENCES] * 3  # the lesson's texts from the catalog's plan
        step = await r.step("new", 1)
        assert step.asr_text == "i like apples"
        assert step.metrics[0].value < 0.5  # "I like apples" is not "How are you?"
        assert step.assessed_at is not None
        assert step.assessment_shed == "asr_saturated"  # why its numbers came late
        assert r.outcomes() == {"assessed": 3.0}

        assert await r.catch_up.catch_up() == 0  # nothing left: nothing run again
        assert len(r.engine.hints) == 3


async def test_nothing_is_taken_up_while_the_asr_is_busy_or_the_loop_overloaded(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path) as r:
        await r.shed(DEV, "i1", 100, [600])
        r.calm[0] = False  # voice overload: the loop has no time to spare
        assert await r.catch_up.catch_up() == 0
        r.calm[0] = True
        r.engine.gate.clear()  # a live answer is being transcribed
        r.path.submit_utterance(
            device=OTHER, instance_id="live", step_index=0, utterance_id="u1",
            pcm=b"\x00\x00" * 9600, prompt_text=None, expected_text="Thank you.",
            methods=("text_similarity_v0",), hints=(),
        )  # fmt: skip
        async with asyncio.timeout(5):
            await r.engine.started.wait()
        assert not r.path.idle
        assert await r.catch_up.catch_up() == 0
        assert r.engine.hints == [()]  # only the live answer reached the engine
        r.engine.gate.set()
        async with asyncio.timeout(5):
            await r.mqtt.event.wait()  # the live assessment
        assert await r.catch_up.catch_up() == 1  # idle again
        assert r.outcomes() == {"assessed": 1.0}


async def test_a_catch_up_job_makes_way_for_a_live_answer_and_is_taken_up_next_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with rig(tmp_path) as r:
        await r.shed(DEV, "i1", 100, [600])
        late = r.path.transcribe_late

        def then_a_live_answer(
            key: AsrKey, pcm: bytes, hints: tuple[str, ...], done: OnLate
        ) -> None:
            late(key, pcm, hints, done)
            r.path.submit_utterance(  # before the worker took the catch-up job: queue of one
                device=OTHER, instance_id="live", step_index=0, utterance_id="u1",
                pcm=b"\x00\x00" * 9600, prompt_text=None, expected_text="Thank you.",
                methods=("text_similarity_v0",), hints=(),
            )  # fmt: skip

        monkeypatch.setattr(r.path, "transcribe_late", then_a_live_answer)
        assert await r.catch_up.catch_up() == 0
        assert r.outcomes() == {"yielded": 1.0}
        snap = r.metrics.snapshot()
        assert snap.get('snlpgw_assessments_shed_total{reason="queue_full"}', 0.0) == 0.0
        assert (await r.step("i1", 0)).assessed_at is None  # as it was
        monkeypatch.undo()
        async with asyncio.timeout(5):
            while not r.path.idle:  # the live answer finishes
                await r.mqtt.event.wait()
                r.mqtt.event.clear()
        assert await r.catch_up.catch_up() == 1
        assert r.outcomes() == {"yielded": 1.0, "assessed": 1.0}


async def test_what_fails_is_not_tried_again_and_nothing_is_written(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        await r.shed(DEV, "i1", 300, [600, 1200, 660])
        r.blobs.delete(r.ids[("i1", 1)])  # gone from the files, its row not yet swept
        (broken,) = (tmp_path / "audio").rglob(r.ids[("i1", 2)] + "*")
        broken.write_bytes(b"not ogg")
        r.engine.fail = True
        assert await r.catch_up.catch_up() == 0
        assert r.outcomes() == {"failed": 1.0}  # the round ends at the ASR's failure
        assert await r.catch_up.catch_up() == 0
        assert r.outcomes() == {"failed": 1.0, "missing": 1.0, "undecodable": 1.0}
        r.engine.fail = False
        assert await r.catch_up.catch_up() == 0  # each tried once by this process
        assert r.published() == []
        assert [(await r.step("i1", k)).assessed_at for k in range(3)] == [None] * 3


async def test_a_device_forgotten_meanwhile_stays_forgotten(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        await r.shed(DEV, "i1", 100, [600])
        r.engine.gate.clear()
        round_ = asyncio.create_task(r.catch_up.catch_up(), name="test.round")
        async with asyncio.timeout(5):
            await r.engine.started.wait()
        await r.store.forget_device(DEV)  # `snlpgw device forget` while the ASR listens
        r.engine.gate.set()
        assert await round_ == 0
        assert r.outcomes() == {"gone": 1.0}
        assert r.published() == []
        assert await r.store.get_instance("i1") is None
        rows = await r.store.call(lambda db: db.query("SELECT COUNT(*) FROM steps"))
        assert rows == [(0,)]


async def test_only_owned_devices_and_only_when_enabled(tmp_path: Path) -> None:
    async with rig(tmp_path, catch_up_interval_s=0.0) as r:
        await r.shed(OTHER, "theirs", 100, [600])
        r.owned.discard(OTHER)  # another gateway of the cluster owns it
        assert await r.catch_up.catch_up() == 0
        assert r.engine.hints == []
        assert not r.catch_up.enabled
        task = asyncio.create_task(r.catch_up.run(), name="test.catch-up")
        await asyncio.sleep(0)
        assert not task.done()  # off: it waits for the service to stop, doing nothing
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_it_runs_every_interval(tmp_path: Path) -> None:
    async with rig(tmp_path, catch_up_interval_s=0.01) as r, asyncio.TaskGroup() as tg:
        await r.shed(DEV, "i1", 100, [600])
        task = tg.create_task(r.catch_up.run(), name="test.catch-up")
        async with asyncio.timeout(10):
            await r.mqtt.event.wait()
        task.cancel()
        assert r.outcomes() == {"assessed": 1.0}


async def test_one_catch_up_job_per_asr_worker_at_a_time(tmp_path: Path) -> None:
    async with rig(tmp_path, workers=2, queue_limit=4) as r:
        await r.shed(DEV, "i1", 100, [600, 600, 1200])
        r.engine.gate.clear()
        round_ = asyncio.create_task(r.catch_up.catch_up(), name="test.round")
        async with asyncio.timeout(5):
            while len(r.engine.hints) < 2:  # both workers take one
                r.engine.started.clear()
                await r.engine.started.wait()
        assert r.path.idle is False
        assert len(r.engine.hints) == 2  # the third waits for a worker, not in the queue
        assert r.metrics.snapshot()["snlpgw_asr_queue_depth"] == 0.0
        r.engine.gate.set()
        assert await round_ == 3
        assert r.outcomes() == {"assessed": 3.0}


async def test_a_store_that_fails_ends_the_round_and_the_step_is_tried_next_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with rig(tmp_path) as r:
        await r.shed(DEV, "i1", 100, [600, 1200])

        async def down(audio_id: str) -> bytes:
            raise OSError("the audio store is down")

        monkeypatch.setattr(r.catch_up, "_read", down)
        assert await r.catch_up.catch_up() == 0
        assert r.outcomes() == {"unavailable": 1.0}  # the round ended at the first
        monkeypatch.undo()
        assert await r.catch_up.catch_up() == 2  # not remembered: both taken up now
        assert r.outcomes() == {"unavailable": 1.0, "assessed": 2.0}


async def test_a_catch_up_job_is_not_submitted_behind_live_work(tmp_path: Path) -> None:
    async with rig(tmp_path, workers=2, queue_limit=4) as r:
        r.engine.gate.clear()  # two live answers: one running, one queued
        for step in range(2):
            r.path.submit_utterance(
                device=OTHER, instance_id="live", step_index=step, utterance_id="u1",
                pcm=b"\x00\x00" * 9600, prompt_text=None, expected_text="Thank you.",
                methods=("text_similarity_v0",), hints=(),
            )  # fmt: skip
        heard: list[object] = []
        key = AsrKey("i1", 0, "catch-up:x")
        r.path.transcribe_late(key, b"\x00\x00" * 960, (), heard.append)
        assert heard == [None]  # not idle: told at once, nothing queued
        assert r.metrics.snapshot()["snlpgw_asr_queue_depth"] >= 1.0
        r.engine.gate.set()


async def test_an_engine_that_is_down_leaves_the_step_for_a_later_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with rig(tmp_path) as r:
        await r.shed(DEV, "i1", 100, [600])
        real = r.engine.run

        async def unavailable(job: AsrJob, timeout_s: float) -> AsrResult | AsrFailure:
            return AsrFailure(FailureReason.ENGINE_UNAVAILABLE, "asr-serve down")

        monkeypatch.setattr(r.engine, "run", unavailable)
        assert await r.catch_up.catch_up() == 0
        assert r.outcomes() == {"failed": 1.0}
        monkeypatch.setattr(r.engine, "run", real)
        assert await r.catch_up.catch_up() == 1  # not remembered: the engine's state
        assert r.outcomes() == {"failed": 1.0, "assessed": 1.0}
