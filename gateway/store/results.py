"""The learning record's read model: a device's history, its progress per lesson over time, and
the flat rows of an export. Shared by the results HTTP API (``results_api.py``) and the web
console, which call the same functions in-process::

    history = await device_history(store, "aa_bb_cc", since_ms=..., until_ms=..., limit=50)
    progress = lesson_progress(history)           # pure: from a history already read
    rows = export_rows(history)                   # pure: one row per step
    text = rows_to_csv(rows)                      # pure: RFC 4180 CSV

Reads raise :class:`~gateway.store.errors.StoreError` (a failing or busy store). Numbers only:
metrics are ``(method, value)`` as stored, never verdicts (SPEC §2 rule 4); progress is the
mean of each method over a lesson run's assessed steps, nothing more.

Behaviour signals (issue #27 item 5, spec §18-19) are stored per step
(``StepRecord.response_latency_ms``, ``StepRecord.step_completed``, migration 0005); a run's
:class:`RunSignals` (steps, responded, completed, mean and median latency) is derived here from
those rows, never stored twice: :func:`run_signals`. Numbers, never a diagnosis.
"""

from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.store.assessments import StepAssessment, assessments_of
from gateway.store.db import Database
from gateway.store.records import InstanceRecord, StepRecord, StoredMetric
from gateway.store.store import Store

MAX_HISTORY = 500  # instances in one read; bounded whatever the caller asks


@dataclass(frozen=True, slots=True)
class InstanceHistory:
    """One task instance (a lesson run) with its steps, in step order."""

    instance: InstanceRecord
    steps: tuple[StepRecord, ...]
    # re-assessments of its archived answers (``snlpgw reassess``), by step, engine, version
    reassessments: tuple[StepAssessment, ...] = ()

    def reassessed(self, step_index: int) -> tuple[StepAssessment, ...]:
        return tuple(r for r in self.reassessments if r.step_index == step_index)


@dataclass(frozen=True, slots=True)
class DeviceHistory:
    """A device's instances created in ``[since_ms, until_ms)``, newest first."""

    device: str
    instances: tuple[InstanceHistory, ...]
    truncated: bool  # more instances matched than ``limit``


@dataclass(frozen=True, slots=True)
class MetricMean:
    method: str
    mean: float
    count: int  # assessed steps that carry this method


@dataclass(frozen=True, slots=True)
class RunSignals:
    """A lesson run's behaviour signals, derived from its steps' stored signals.

    ``steps``: steps that carry a signal (STEPS tasks' answered listen steps; clip-stepped
    lessons carry none); ``responded``: of those, steps with a response latency (the child
    started speaking); ``completed``: steps that ran to their end with a transcript;
    ``mean_latency_ms`` / ``median_latency_ms``: over the responded steps (None: none)."""

    steps: int
    responded: int
    completed: int
    mean_latency_ms: float | None
    median_latency_ms: float | None


@dataclass(frozen=True, slots=True)
class ProgressPoint:
    """One run of a lesson: when, how far, and its metrics' means."""

    instance_id: str
    created_ms: int | None
    ended_ms: int | None
    state: str | None
    steps: int
    steps_assessed: int
    metrics: tuple[MetricMean, ...]
    signals: RunSignals | None = None  # None: no step of the run carries a signal


@dataclass(frozen=True, slots=True)
class LessonProgress:
    """A lesson's runs, oldest first (a curve over time)."""

    app_id: str | None
    task_id: str | None
    lesson_id: str | None
    points: tuple[ProgressPoint, ...]


EXPORT_COLUMNS = (
    "device",
    "instance_id",
    "app_id",
    "task_id",
    "lesson_id",
    "mode",
    "state",
    "created_ms",
    "ended_ms",
    "step_index",
    "clip",
    "prompt_text",
    "expected_text",
    "asr_text",
    "assessed_at",
    "failure",
    "assessment_shed",
    "audio_id",
    "response_latency_ms",
    "step_completed",
)
_STEP_COLUMNS = EXPORT_COLUMNS[9:]
# the run's behaviour signals (:class:`RunSignals`), repeated on each of its rows
SIGNAL_COLUMNS = (
    "run_signal_steps",
    "run_responded",
    "run_completed",
    "run_mean_latency_ms",
    "run_median_latency_ms",
)


# ---- reads ----------------------------------------------------------------------------------


async def device_history(
    store: Store,
    device: str,
    *,
    since_ms: int | None = None,
    until_ms: int | None = None,
    limit: int = 50,
) -> DeviceHistory:
    """The device's instances (newest first, at most ``limit``, capped at
    :data:`MAX_HISTORY`) with their steps, read in one job on the store's thread."""
    limit = max(1, min(limit, MAX_HISTORY))
    return await store.call(lambda db: read_history(db, device, since_ms, until_ms, limit))


def read_history(
    db: Database, device: str, since_ms: int | None, until_ms: int | None, limit: int
) -> DeviceHistory:
    """Synchronous twin of :func:`device_history` (on the store thread)."""
    instances = db.device_instances(device, since_ms=since_ms, until_ms=until_ms, limit=limit + 1)
    truncated = len(instances) > limit
    instances = instances[:limit]
    ids = [i.instance_id for i in instances]
    by_instance: dict[str, list[StepRecord]] = {}
    for step in db.steps_of(ids):
        by_instance.setdefault(step.instance_id, []).append(step)
    again: dict[str, list[StepAssessment]] = {}
    for row in assessments_of(db, ids):
        again.setdefault(row.instance_id, []).append(row)
    return DeviceHistory(
        device=device,
        instances=tuple(
            InstanceHistory(
                i,
                tuple(by_instance.get(i.instance_id, ())),
                tuple(again.get(i.instance_id, ())),
            )
            for i in instances
        ),
        truncated=truncated,
    )


# ---- pure views -------------------------------------------------------------------------------


def metric_means(steps: Sequence[StepRecord]) -> tuple[MetricMean, ...]:
    """Each method's mean over the steps that carry it, methods sorted."""
    sums: dict[str, list[float]] = {}
    for step in steps:
        for metric in step.metrics:
            sums.setdefault(metric.method, []).append(metric.value)
    return tuple(
        MetricMean(method, sum(values) / len(values), len(values))
        for method, values in sorted(sums.items())
    )


def run_signals(steps: Sequence[StepRecord]) -> RunSignals | None:
    """The run's behaviour signals from its steps' stored ones; None when no step has any."""
    signalled = [
        s for s in steps if s.step_completed is not None or s.response_latency_ms is not None
    ]
    if not signalled:
        return None
    latencies = [s.response_latency_ms for s in signalled if s.response_latency_ms is not None]
    return RunSignals(
        steps=len(signalled),
        responded=len(latencies),
        completed=sum(1 for s in signalled if s.step_completed),
        mean_latency_ms=statistics.fmean(latencies) if latencies else None,
        median_latency_ms=float(statistics.median(latencies)) if latencies else None,
    )


def lesson_progress(history: DeviceHistory) -> tuple[LessonProgress, ...]:
    """Runs grouped by (app, task, lesson), each lesson's runs oldest first; lessons sorted."""
    lessons: dict[tuple[str, str, str], list[ProgressPoint]] = {}
    keys: dict[tuple[str, str, str], tuple[str | None, str | None, str | None]] = {}
    for run in history.instances:
        inst = run.instance
        raw = (inst.app_id, inst.task_id, inst.lesson_id)
        key = (inst.app_id or "", inst.task_id or "", inst.lesson_id or "")
        keys[key] = raw
        assessed = [s for s in run.steps if s.assessed_at is not None]
        lessons.setdefault(key, []).append(
            ProgressPoint(
                instance_id=inst.instance_id,
                created_ms=inst.created_ms,
                ended_ms=inst.ended_ms,
                state=None if inst.state is None else inst.state.value,
                steps=len(run.steps),
                steps_assessed=len(assessed),
                metrics=metric_means(assessed),
                signals=run_signals(run.steps),
            )
        )
    return tuple(
        LessonProgress(
            *keys[key],
            points=tuple(
                sorted(points, key=lambda p: (p.created_ms or 0, p.instance_id)),
            ),
        )
        for key, points in sorted(lessons.items())
    )


def metric_methods(history: DeviceHistory) -> tuple[str, ...]:
    """Every metric method present, sorted (the export's metric columns)."""
    return tuple(
        sorted({m.method for run in history.instances for s in run.steps for m in s.metrics})
    )


def export_rows(history: DeviceHistory) -> list[dict[str, object]]:
    """One flat row per step (instances newest first, steps in order): the
    :data:`EXPORT_COLUMNS`, the run's :data:`SIGNAL_COLUMNS`, then ``metric:<method>`` for every
    method present (``None`` where a step lacks it). An instance without steps gives one row
    with empty step fields."""
    methods = metric_methods(history)
    rows: list[dict[str, object]] = []
    for run in history.instances:
        inst = run.instance
        base: dict[str, object] = {
            "device": inst.device_id,
            "instance_id": inst.instance_id,
            "app_id": inst.app_id,
            "task_id": inst.task_id,
            "lesson_id": inst.lesson_id,
            "mode": inst.mode,
            "state": None if inst.state is None else inst.state.value,
            "created_ms": inst.created_ms,
            "ended_ms": inst.ended_ms,
        }
        base.update(_signal_fields(run_signals(run.steps)))
        for step in run.steps or (None,):
            row = dict(base)
            row.update(_step_fields(step))
            values = _metric_map(step.metrics if step is not None else ())
            for method in methods:
                row[f"metric:{method}"] = values.get(method)
            rows.append(row)
    return rows


def _step_fields(step: StepRecord | None) -> dict[str, object]:
    if step is None:
        return dict.fromkeys(_STEP_COLUMNS)
    return {
        "step_index": step.step_index,
        "clip": step.clip,
        "prompt_text": step.prompt_text,
        "expected_text": step.expected_text,
        "asr_text": step.asr_text,
        "assessed_at": step.assessed_at,
        "failure": step.failure,
        "assessment_shed": step.assessment_shed,
        "audio_id": step.audio_id,
        "response_latency_ms": step.response_latency_ms,
        "step_completed": step.step_completed,
    }


def _signal_fields(signals: RunSignals | None) -> dict[str, object]:
    if signals is None:
        return dict.fromkeys(SIGNAL_COLUMNS)
    return dict(
        zip(
            SIGNAL_COLUMNS,
            (
                signals.steps,
                signals.responded,
                signals.completed,
                signals.mean_latency_ms,
                signals.median_latency_ms,
            ),
            strict=True,
        )
    )


def _metric_map(metrics: Sequence[StoredMetric]) -> dict[str, float]:
    return {m.method: m.value for m in metrics}


def export_columns(methods: Sequence[str]) -> tuple[str, ...]:
    """The export's columns: :data:`EXPORT_COLUMNS`, :data:`SIGNAL_COLUMNS`, then
    ``metric:<method>`` for each."""
    return (*EXPORT_COLUMNS, *SIGNAL_COLUMNS, *(f"metric:{m}" for m in methods))


def rows_to_csv(rows: Sequence[dict[str, object]], methods: Sequence[str]) -> str:
    """CSV with a header line (:func:`export_columns`); ``None`` is empty.
    A cell a spreadsheet would run as a formula (``= + - @`` first) is prefixed with ``'``."""
    out = io.StringIO()
    columns = export_columns(methods)
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row.get(c)) for c in columns])
    return out.getvalue()


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    text = str(value)
    if isinstance(value, str) and text[:1] in ("=", "+", "-", "@"):
        return "'" + text  # CSV injection: transcripts are children's words, not formulas
    return text
