"""Re-assessment rows on both backends (SQLite, a real PostgreSQL): the archived-step
selection, insert-once rows, and the read back."""

from __future__ import annotations

from gateway.store import InstanceRecord, StepRecord, Store, StoredMetric
from gateway.store.assessments import (
    StepAssessment,
    add_assessments,
    archived_steps,
    assessed_keys,
    assessments_of,
)
from gateway.store.dialect import Connector
from tests.unit.store.test_store import running


def _row(step: int, value: float, version: str = "v1") -> StepAssessment:
    return StepAssessment(
        "i1", step, "pocketsphinx", version, "good morning",
        (StoredMetric("text_similarity_v0", value),), f"a{step}", 1000 + step,
    )  # fmt: skip


async def test_selection_rows_written_once_and_read_back(connector: Connector) -> None:
    store = Store(connect=connector)
    async with running(store):
        for iid, dev, created in (("i1", "d1", 100), ("i2", "d1", 200), ("i3", "d2", 300)):
            store.submit_instance(InstanceRecord(iid, device_id=dev, created_ms=created))
            for step, text in enumerate(("One.", "Two.", "Three.")):
                audio = f"a{step}" if step != 1 else None  # step 1: nothing kept
                store.submit_step(StepRecord(iid, step, expected_text=text, audio_id=audio))
        await store.flush()

        selected = await store.call(
            lambda db: archived_steps(
                db, instance_id=None, device="d1", since_ms=None, until_ms=None, limit=100
            )
        )
        assert [(s.instance_id, s.step_index) for s in selected] == [
            ("i1", 0), ("i1", 2), ("i2", 0), ("i2", 2),
        ]  # fmt: skip
        assert selected[0].hints == ("One.", "Two.", "Three.")
        assert selected[0].expected_text == "One."
        ranged = await store.call(
            lambda db: archived_steps(
                db, instance_id=None, device=None, since_ms=150, until_ms=300, limit=100
            )
        )
        assert {s.instance_id for s in ranged} == {"i2"}
        one = await store.call(
            lambda db: archived_steps(
                db, instance_id="i3", device=None, since_ms=None, until_ms=None, limit=1
            )
        )
        assert [(s.instance_id, s.step_index) for s in one] == [("i3", 0)]

        await store.call(lambda db: add_assessments(db, [_row(0, 1.0), _row(2, 0.5)]))
        await store.call(lambda db: add_assessments(db, [_row(0, 0.1)]))  # exists: kept as is
        await store.call(lambda db: add_assessments(db, [_row(0, 0.9, "v2")]))
        rows = await store.call(lambda db: assessments_of(db, ["i1", "i2"]))
        assert rows == [_row(0, 1.0), _row(0, 0.9, "v2"), _row(2, 0.5)]
        keys = await store.call(lambda db: assessed_keys(db, "pocketsphinx", "v1"))
        assert keys == {("i1", 0), ("i1", 2)}
