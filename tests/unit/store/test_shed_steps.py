"""Catch-up's store side on both backends: which shed answers are waiting, and the late write
that never brings back an erased step nor overwrites an assessed one."""

from __future__ import annotations

import functools

from gateway.store import InstanceRecord, StepRecord, Store, StoredMetric
from gateway.store.assessments import record_late_assessment, shed_devices, shed_steps
from gateway.store.dialect import Connector
from gateway.store.records import ArchivedAudio
from tests.unit.store.test_store import running

SIM = "text_similarity_v0"


async def _shed(
    store: Store, device: str, iid: str, created: int, steps: int, *, audio: bool = True
) -> None:
    store.submit_instance(
        InstanceRecord(
            iid, device_id=device, app_id="english_learning", task_id="shadowing",
            lesson_id="unit01", created_ms=created,
        )
    )  # fmt: skip
    for k in range(steps):
        audio_id = f"{iid}-a{k}"
        store.submit_step(
            StepRecord(
                iid, k, prompt_text=f"/clips/{k}.mp3", expected_text=f"sentence {k}",
                audio_id=audio_id, assessment_shed="asr_saturated",
            )
        )  # fmt: skip
        if audio:
            await store.add_audio(ArchivedAudio(audio_id, device, iid, k, created, 100, 1200))
    await store.flush()


async def test_waiting_answers_are_the_shed_unassessed_archived_ones_newest_lesson_first(
    connector: Connector,
) -> None:
    store = Store(connect=connector)
    async with running(store):
        await _shed(store, "dev-a", "old", 100, 2)
        await _shed(store, "dev-a", "new", 300, 2)
        await _shed(store, "dev-b", "b1", 200, 1)
        await _shed(store, "dev-c", "swept", 250, 1, audio=False)  # no audio row (queue full)
        await _shed(store, "dev-d", "expired", 260, 1)
        await store.delete_audio(["expired-a0"])  # retention: row gone, steps.audio_id cleared
        store.submit_step(StepRecord("new", 2, audio_id="x", expected_text="live"))  # not shed
        store.submit_step(  # shed, then assessed (by an earlier catch-up)
            StepRecord("old", 1, asr_text="said", metrics=(StoredMetric(SIM, 0.5),), assessed_at=1)
        )
        await store.flush()

        assert sorted(await store.call(lambda db: shed_devices(db, 10))) == ["dev-a", "dev-b"]
        steps = await store.call(lambda db: shed_steps(db, ["dev-a", "dev-b"], 10))
        assert [(s.instance_id, s.step_index) for s in steps] == [
            ("new", 0), ("new", 1), ("b1", 0), ("old", 0)
        ]  # fmt: skip
        first = steps[0]
        assert (first.device, first.app_id, first.task_id, first.lesson_id) == (
            "dev-a", "english_learning", "shadowing", "unit01"
        )  # fmt: skip
        assert (first.prompt_text, first.expected_text, first.audio_id) == (
            "/clips/0.mp3", "sentence 0", "new-a0"
        )  # fmt: skip
        only_b = await store.call(lambda db: shed_steps(db, ["dev-b"], 10))
        assert [s.instance_id for s in only_b] == ["b1"]
        assert await store.call(lambda db: shed_steps(db, [], 10)) == []
        assert len(await store.call(lambda db: shed_steps(db, ["dev-a"], 2))) == 2


async def test_a_late_assessment_is_written_once_keeps_its_reason_and_never_revives_a_forgotten_step(
    connector: Connector,
) -> None:
    store = Store(connect=connector)
    async with running(store):
        await _shed(store, "dev-a", "i1", 100, 2)
        await _shed(store, "dev-b", "i2", 100, 1)
        write = functools.partial(
            record_late_assessment, asr_text="sentence zero", metrics=[StoredMetric(SIM, 0.75)],
            assessed_at=5_000,
        )  # fmt: skip

        assert await store.call(lambda db: write(db, instance_id="i1", step_index=0)) is True
        again = functools.partial(write, asr_text="other", assessed_at=6_000)
        assert await store.call(lambda db: again(db, instance_id="i1", step_index=0)) is False
        found = await store.get_instance("i1")
        assert found is not None
        step = found[1][0]
        assert (step.asr_text, step.metrics, step.assessed_at) == (
            "sentence zero", (StoredMetric(SIM, 0.75),), 5_000
        )  # fmt: skip
        assert step.assessment_shed == "asr_saturated"  # why its numbers came late
        assert [
            s.step_index for s in await store.call(lambda db: shed_steps(db, ["dev-a"], 9))
        ] == [1]

        await store.forget_device("dev-b")
        assert await store.call(lambda db: write(db, instance_id="i2", step_index=0)) is False
        assert await store.get_instance("i2") is None
        assert await store.call(
            lambda db: db.query("SELECT COUNT(*) FROM steps WHERE instance_id = 'i2'")
        ) == [(0,)]
