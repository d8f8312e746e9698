"""The results read model on both backends (SQLite, a real PostgreSQL) and its pure views."""

from __future__ import annotations

import csv
import io

from gateway.console.seams import StoreResults
from gateway.store import InstanceRecord, InstanceState, StepRecord, Store, StoredMetric
from gateway.store.dialect import Connector
from gateway.store.results import (
    EXPORT_COLUMNS,
    MAX_HISTORY,
    SIGNAL_COLUMNS,
    DeviceHistory,
    InstanceHistory,
    RunSignals,
    device_history,
    export_rows,
    lesson_progress,
    metric_methods,
    rows_to_csv,
    run_signals,
)
from tests.unit.store.test_store import running

SIM = "text_similarity_v0"
WER = "wer_v0"


async def _fill(store: Store) -> None:
    for n, (lesson, created) in enumerate([("unit01", 100), ("unit02", 200), ("unit01", 300)]):
        store.submit_instance(
            InstanceRecord(
                f"i{n}",
                device_id="dev-a",
                app_id="english_learning",
                task_id="shadowing",
                lesson_id=lesson,
                state=InstanceState.COMPLETED,
                created_ms=created,
                ended_ms=created + 50,
            )
        )
        for step in range(2):
            value = 0.5 + 0.25 * step if n < 2 else 1.0
            store.submit_step(
                StepRecord(
                    f"i{n}",
                    step,
                    expected_text=f"sentence {step}",
                    asr_text=f"said {step}",
                    metrics=(StoredMetric(SIM, value),),
                    assessed_at=created + 10,
                )
            )
    store.submit_step(StepRecord("i2", 2, expected_text="not said", failure="audio.failed"))
    store.submit_instance(InstanceRecord("other", device_id="dev-b", created_ms=150))
    await store.flush()


async def test_history_filters_by_device_and_time_on_both_backends(connector: Connector) -> None:
    store = Store(connect=connector)
    async with running(store):
        await _fill(store)
        everything = await device_history(store, "dev-a")
        assert [r.instance.instance_id for r in everything.instances] == ["i2", "i1", "i0"]
        assert not everything.truncated
        assert [s.step_index for s in everything.instances[0].steps] == [0, 1, 2]
        assert everything.instances[0].steps[0].metrics == (StoredMetric(SIM, 1.0),)
        window = await device_history(store, "dev-a", since_ms=150, until_ms=300)
        assert [r.instance.instance_id for r in window.instances] == ["i1"]
        limited = await device_history(store, "dev-a", limit=2)
        assert [r.instance.instance_id for r in limited.instances] == ["i2", "i1"]
        assert limited.truncated
        assert (await device_history(store, "nobody")).instances == ()
        assert [r.instance.instance_id for r in (await device_history(store, "dev-b")).instances]


async def test_behaviour_signals_read_back_and_summed_per_run_on_both_backends(
    connector: Connector,
) -> None:
    """Step signals as the inline path stores them (migration 0005), then the run's signals
    derived from the rows read back from the database."""
    store = Store(connect=connector)
    async with running(store):
        store.submit_instance(
            InstanceRecord("s1", device_id="dev-s", task_id="arith", created_ms=5)
        )
        for index, latency, completed in [(0, 800, 1), (1, None, 0), (2, 1500, 1), (3, 400, 0)]:
            store.submit_step(StepRecord("s1", index, expected_text=f"q{index}"))
            store.submit_step(
                StepRecord(
                    "s1",
                    index,
                    asr_text="three" if completed else None,
                    metrics=(StoredMetric("task.correct", float(completed)),),
                    assessed_at=10 + index,
                    response_latency_ms=latency,
                    step_completed=completed,
                )
            )
        store.submit_instance(
            InstanceRecord("s0", device_id="dev-s", task_id="shadow", created_ms=1)
        )
        store.submit_step(StepRecord("s0", 0, expected_text="no signals here"))
        await store.flush()
        history = await device_history(store, "dev-s")
        runs = {r.instance.instance_id: r for r in history.instances}
        steps = runs["s1"].steps
        assert [(s.response_latency_ms, s.step_completed) for s in steps] == [
            (800, 1),
            (None, 0),
            (1500, 1),
            (400, 0),
        ]
        assert run_signals(steps) == RunSignals(4, 3, 2, 900.0, 800.0)
        assert run_signals(runs["s0"].steps) is None
        points = {p.instance_id: p for lesson in lesson_progress(history) for p in lesson.points}
        assert points["s1"].signals == RunSignals(4, 3, 2, 900.0, 800.0)
        assert points["s0"].signals is None
        rows = [r for r in export_rows(history) if r["instance_id"] == "s1"]
        assert [r["response_latency_ms"] for r in rows] == [800, None, 1500, 400]
        assert [r["step_completed"] for r in rows] == [1, 0, 1, 0]
        assert {(r["run_responded"], r["run_median_latency_ms"]) for r in rows} == {(3, 800.0)}


async def test_many_instances_read_in_chunks_and_capped(connector: Connector) -> None:
    store = Store(connect=connector)
    async with running(store):
        for n in range(MAX_HISTORY + 5):
            store.submit_instance(InstanceRecord(f"x{n:04d}", device_id="d", created_ms=n))
            store.submit_step(StepRecord(f"x{n:04d}", 0, expected_text="e"))
        await store.flush()
        got = await device_history(store, "d", limit=10_000)
        assert len(got.instances) == MAX_HISTORY
        assert got.truncated
        assert all(len(r.steps) == 1 for r in got.instances)


def _history() -> DeviceHistory:
    def inst(i: str, lesson: str | None, created: int | None) -> InstanceRecord:
        return InstanceRecord(i, device_id="d", lesson_id=lesson, created_ms=created)

    return DeviceHistory(
        "d",
        (
            InstanceHistory(
                inst("b", "L1", 20),
                (
                    StepRecord("b", 0, metrics=(StoredMetric(SIM, 1.0),), assessed_at=1),
                    StepRecord(
                        "b",
                        1,
                        metrics=(StoredMetric(SIM, 0.5), StoredMetric(WER, 0.2)),
                        assessed_at=2,
                    ),
                    StepRecord("b", 2, asr_text=None),
                ),
            ),
            InstanceHistory(inst("c", None, None), ()),
            InstanceHistory(
                inst("a", "L1", 10),
                (
                    StepRecord(
                        "a", 0, asr_text="=cmd()", metrics=(StoredMetric(SIM, 0.25),), assessed_at=3
                    ),
                ),
            ),
        ),
        truncated=False,
    )


def test_run_signals_counts_only_signalled_steps() -> None:
    assert run_signals(()) is None
    assert run_signals([StepRecord("x", 0, asr_text="a")]) is None
    silent = run_signals([StepRecord("x", 0, step_completed=0), StepRecord("x", 1)])
    assert silent == RunSignals(1, 0, 0, None, None)  # nothing said: no latency to average
    even = run_signals(
        [
            StepRecord("x", i, response_latency_ms=ms, step_completed=1)
            for i, ms in enumerate((100, 300))
        ]
    )
    assert even == RunSignals(2, 2, 2, 200.0, 200.0)


def test_progress_groups_by_lesson_oldest_first_with_means() -> None:
    lessons = lesson_progress(_history())
    assert [lesson.lesson_id for lesson in lessons] == [None, "L1"]
    l1 = lessons[1]
    assert [p.instance_id for p in l1.points] == ["a", "b"]
    b = l1.points[1]
    assert (b.steps, b.steps_assessed) == (3, 2)
    assert [(m.method, m.mean, m.count) for m in b.metrics] == [(SIM, 0.75, 2), (WER, 0.2, 1)]
    assert lessons[0].points[0].steps == 0
    assert lessons[0].points[0].metrics == ()


def test_export_rows_and_csv() -> None:
    history = _history()
    rows = export_rows(history)
    assert len(rows) == 3 + 1 + 1  # an instance without steps still has its row
    assert metric_methods(history) == (SIM, WER)
    assert rows[1][f"metric:{WER}"] == 0.2
    assert rows[0][f"metric:{WER}"] is None
    text = rows_to_csv(rows, metric_methods(history))
    parsed = list(csv.reader(io.StringIO(text)))
    assert parsed[0] == [*EXPORT_COLUMNS, *SIGNAL_COLUMNS, f"metric:{SIM}", f"metric:{WER}"]
    assert "response_latency_ms" in EXPORT_COLUMNS
    assert "step_completed" in EXPORT_COLUMNS
    assert len(parsed) == 6
    header = parsed[0]
    last = dict(zip(header, parsed[-1], strict=True))
    assert last["asr_text"] == "'=cmd()"  # never a live spreadsheet formula
    assert last[f"metric:{SIM}"] == "0.25"
    assert last[f"metric:{WER}"] == ""
    empty = dict(zip(header, parsed[4], strict=True))
    assert empty["instance_id"] == "c"
    assert empty["step_index"] == ""
    assert empty["run_signal_steps"] == ""  # no signals: empty cells, not zeros


async def test_console_counts_a_clip_step_and_a_steps_step_done_on_both_backends(
    connector: Connector,
) -> None:
    """The console's "sentences done": a clip step whose clip completed, a STEPS step that ran
    to its end; a failed clip step and a cut-short STEPS step are not done."""
    store = Store(connect=connector)
    async with running(store):
        store.submit_instance(InstanceRecord("clip", device_id="d", created_ms=1))
        store.submit_instance(InstanceRecord("steps", device_id="d", created_ms=2))
        store.submit_instance(InstanceRecord("none", device_id="d", created_ms=3))
        for index, completed_ms in [(0, 10), (1, 20), (2, None)]:
            store.submit_step(StepRecord("clip", index, completed_ms=completed_ms))
        for index, done in [(0, 1), (1, 0), (2, 1)]:
            store.submit_step(StepRecord("steps", index, step_completed=done))
        store.submit_step(StepRecord("none", 0, failure="audio.failed"))
        await store.flush()
        done = await StoreResults(store).steps_done(["clip", "steps", "none", "absent"])
        assert done == {"clip": 2, "steps": 2, "none": 0}
        assert await StoreResults(store).steps_done([]) == {}
