"""Re-assessment rows (table ``assessments``, migration 0008): ASR and metrics re-run on a
step's archived answer, one row per (step, engine, engine version), beside the step's original
assessment. Written once: a row that exists is never replaced (re-running is idempotent).

Catch-up (``gateway/assessment/catchup.py``): the steps shed under load whose answer is still
archived and that nobody has assessed since (:func:`shed_steps`, migration 0009's index), and
the step's own assessment written late (:func:`record_late_assessment`), only where the step
still exists and is still unassessed.

Functions take a :class:`~gateway.store.db.Database` and run on the store's thread
(``await store.call(lambda db: ...)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.store.db import Database
from gateway.store.records import StoredMetric, metrics_from_text, metrics_to_text

_COLUMNS = (
    "instance_id, step_index, engine, engine_version, asr_text, metrics, audio_id, assessed_ms"
)


@dataclass(frozen=True, slots=True)
class StepAssessment:
    """One re-assessment of a step's archived answer by one engine version."""

    instance_id: str
    step_index: int
    engine: str
    engine_version: str
    asr_text: str | None
    metrics: tuple[StoredMetric, ...]
    audio_id: str | None
    assessed_ms: int


@dataclass(frozen=True, slots=True)
class ArchivedStep:
    """A step whose answer is archived: what re-assessment needs of it."""

    instance_id: str
    step_index: int
    device: str | None
    expected_text: str | None
    audio_id: str
    hints: tuple[str, ...]  # the instance's reference sentences, in step order


@dataclass(frozen=True, slots=True)
class ShedStep:
    """A step shed under load, its answer archived, not assessed since: what catch-up needs."""

    instance_id: str
    step_index: int
    device: str
    app_id: str | None
    task_id: str | None
    lesson_id: str | None
    prompt_text: str | None
    expected_text: str | None
    audio_id: str


# Shed, unassessed, the audio still archived (retention clears steps.audio_id and deletes the
# audio row; forget deletes both). The first three conditions are migration 0009's index's:
# a step whose audio is gone (or was never kept) leaves the index.
_SHED_FROM = (
    "FROM steps s JOIN instances i ON i.id = s.instance_id JOIN audio a ON a.id = s.audio_id "
    "WHERE s.assessment_shed IS NOT NULL AND s.assessed_at IS NULL AND s.audio_id IS NOT NULL"
)


def shed_devices(db: Database, limit: int) -> list[str]:
    """Devices with a shed, unassessed, archived answer (at most ``limit``)."""
    rows = db.query(f"SELECT DISTINCT i.device {_SHED_FROM} LIMIT ?", (limit,))
    return [str(r[0]) for r in rows]


def shed_steps(db: Database, devices: Sequence[str], limit: int) -> list[ShedStep]:
    """Those devices' shed, unassessed, archived answers: the newest instance first (a parent
    looks at the latest lesson first), its steps in order."""
    if not devices:
        return []
    marks = ", ".join("?" for _ in devices)
    rows = db.query(
        "SELECT s.instance_id, s.step_index, i.device, i.app_id, i.task_id, i.lesson_id, "
        f"s.prompt_text, s.expected_text, s.audio_id {_SHED_FROM} AND i.device IN ({marks}) "
        "ORDER BY i.created_ms DESC, s.instance_id, s.step_index LIMIT ?",
        (*devices, limit),
    )
    return [
        ShedStep(
            instance_id=str(r[0]),
            step_index=int(r[1]),  # type: ignore[call-overload]
            device=str(r[2]),
            app_id=_text(r[3]),
            task_id=_text(r[4]),
            lesson_id=_text(r[5]),
            prompt_text=_text(r[6]),
            expected_text=_text(r[7]),
            audio_id=str(r[8]),
        )
        for r in rows
    ]


def record_late_assessment(
    db: Database,
    *,
    instance_id: str,
    step_index: int,
    asr_text: str | None,
    metrics: Sequence[StoredMetric],
    assessed_at: int,
) -> bool:
    """The step's own assessment, written late: True if written. Only an UPDATE of a step that
    is still unassessed: a step erased meanwhile (``device forget``) is never written again, and
    a step assessed meanwhile keeps its assessment. ``assessment_shed`` stays: why it was late."""
    changed = db.change(
        [
            (
                "UPDATE steps SET asr_text = ?, metrics = ?, assessed_at = ? "
                "WHERE instance_id = ? AND step_index = ? AND assessed_at IS NULL",
                (asr_text, metrics_to_text(tuple(metrics)), assessed_at, instance_id, step_index),
            )
        ]
    )
    return changed == 1


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def add_assessments(db: Database, rows: Sequence[StepAssessment]) -> None:
    """Insert ``rows``; a row whose key exists is left as it is."""
    marks = ", ".join("?" for _ in range(8))
    db.change(
        [
            (
                f"INSERT INTO assessments ({_COLUMNS}) VALUES ({marks}) "  # noqa: S608  # constants
                "ON CONFLICT (instance_id, step_index, engine, engine_version) DO NOTHING",
                (
                    r.instance_id,
                    r.step_index,
                    r.engine,
                    r.engine_version,
                    r.asr_text,
                    metrics_to_text(r.metrics),
                    r.audio_id,
                    r.assessed_ms,
                ),
            )
            for r in rows
        ]
    )


def assessments_of(db: Database, instance_ids: Sequence[str]) -> list[StepAssessment]:
    """Every re-assessment of these instances, by instance, step, engine, version."""
    found: list[StepAssessment] = []
    ids = list(dict.fromkeys(instance_ids))
    for start in range(0, len(ids), 200):
        chunk = ids[start : start + 200]
        marks = ", ".join("?" for _ in chunk)
        rows = db.query(
            f"SELECT {_COLUMNS} FROM assessments WHERE instance_id IN ({marks}) "  # noqa: S608
            "ORDER BY instance_id, step_index, engine, engine_version",
            chunk,
        )
        found.extend(_row(r) for r in rows)
    return found


def archived_steps(
    db: Database,
    *,
    instance_id: str | None,
    device: str | None,
    since_ms: int | None,
    until_ms: int | None,
    limit: int,
) -> list[ArchivedStep]:
    """Steps with an archived answer in the selection (instances created in
    ``[since_ms, until_ms)``), oldest instance first; hints are each instance's stored
    reference sentences in step order."""
    where, params = ["s.audio_id IS NOT NULL"], []
    for clause, value in (
        ("i.id = ?", instance_id),
        ("i.device = ?", device),
        ("i.created_ms >= ?", since_ms),
        ("i.created_ms < ?", until_ms),
    ):
        if value is not None:
            where.append(clause)
            params.append(value)
    rows = db.query(
        "SELECT s.instance_id, s.step_index, i.device, s.expected_text, s.audio_id "  # noqa: S608
        "FROM steps s JOIN instances i ON i.id = s.instance_id "
        f"WHERE {' AND '.join(where)} ORDER BY i.created_ms, s.instance_id, s.step_index LIMIT ?",
        (*params, limit),
    )
    ids = list(dict.fromkeys(str(r[0]) for r in rows))
    hints: dict[str, list[str]] = {}
    for start in range(0, len(ids), 200):
        chunk = ids[start : start + 200]
        marks = ", ".join("?" for _ in chunk)
        for iid, text in db.query(
            f"SELECT instance_id, expected_text FROM steps WHERE instance_id IN ({marks}) "  # noqa: S608
            "AND expected_text IS NOT NULL ORDER BY instance_id, step_index",
            chunk,
        ):
            hints.setdefault(str(iid), []).append(str(text))
    return [
        ArchivedStep(
            instance_id=str(r[0]),
            step_index=int(r[1]),  # type: ignore[call-overload]
            device=_text(r[2]),
            expected_text=_text(r[3]),
            audio_id=str(r[4]),
            hints=tuple(dict.fromkeys(hints.get(str(r[0]), ()))),
        )
        for r in rows
    ]


def assessed_keys(db: Database, engine: str, version: str) -> set[tuple[str, int]]:
    """(instance, step) already re-assessed by this engine version."""
    rows = db.query(
        "SELECT instance_id, step_index FROM assessments WHERE engine = ? AND engine_version = ?",
        (engine, version),
    )
    return {(str(r[0]), int(r[1])) for r in rows}  # type: ignore[call-overload]


def _row(r: tuple[object, ...]) -> StepAssessment:
    instance_id, step, engine, version, text, metrics, audio_id, at = r
    return StepAssessment(
        str(instance_id),
        int(step),  # type: ignore[call-overload]
        str(engine),
        str(version),
        None if text is None else str(text),
        metrics_from_text(None if metrics is None else str(metrics)),
        None if audio_id is None else str(audio_id),
        int(at),  # type: ignore[call-overload]
    )
