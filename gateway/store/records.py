"""The stored records of task instances and steps, and the one place their merge rules live.

Records are frozen dataclasses. Every field except the key may be ``None`` (meaning "not part
of this update"), so the same types carry full snapshots, partial updates and read results.

Merge rules (SPEC §5), applied identically by :func:`merge_instance` / :func:`merge_step`
(coalescing pending updates in memory) and by the SQL upserts in ``schema.py``:

* a field that is ``None`` in the update keeps the stored value; any other value replaces it;
* step ``metrics``: an empty update keeps existing non-empty metrics, a non-empty one replaces;
* instance ``created_ms``: the first value written wins (later ones are ignored);
* instance ``reason`` belongs to the state it came with: an update carrying a ``state`` sets
  ``reason`` to the update's value, ``None`` included (so resuming clears ``offline``); an
  update without a state keeps the stored reason unless it gives one.

Metrics are numbers, never verdicts (SPEC §2 rule 4): a list of ``{"method", "value"}``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields

from gateway.tasks.core.effects import InstanceState  # one lifecycle vocabulary for both


@dataclass(frozen=True, slots=True)
class StoredMetric:
    method: str
    value: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.value):
            raise ValueError(f"metric {self.method!r} value is not finite: {self.value!r}")


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    instance_id: str
    device_id: str | None = None
    app_id: str | None = None
    task_id: str | None = None
    lesson_id: str | None = None
    mode: str | None = None
    priority: int | None = None
    source: str | None = None
    state: InstanceState | None = None
    reason: str | None = None
    created_ms: int | None = None
    updated_ms: int | None = None
    ended_ms: int | None = None
    current_step: int | None = None
    resume: str | None = None  # opaque JSON text owned by the runtime (restart-resume)

    def to_json(self) -> dict[str, object]:
        """The HTTP / manager view (``resume`` is internal and left out)."""
        return {
            "instance_id": self.instance_id,
            "device": self.device_id,
            "app_id": self.app_id,
            "task_id": self.task_id,
            "lesson_id": self.lesson_id,
            "mode": self.mode,
            "priority": self.priority,
            "source": self.source,
            "state": None if self.state is None else self.state.value,
            "reason": self.reason,
            "created_ms": self.created_ms,
            "updated_ms": self.updated_ms,
            "ended_ms": self.ended_ms,
            "current_step": self.current_step,
        }


@dataclass(frozen=True, slots=True)
class StepRecord:
    instance_id: str
    step_index: int
    clip: str | None = None
    prompt_text: str | None = None  # the SD/board path of the clip
    expected_text: str | None = None
    asr_text: str | None = None
    metrics: tuple[StoredMetric, ...] = ()  # empty: keep what is stored
    assessed_at: int | None = None  # epoch ms
    played_ms: int | None = None
    completed_ms: int | None = None
    duration_ms: int | None = None
    window_ms: int | None = None
    window_opened_ms: int | None = None
    window_planned_close_ms: int | None = None
    window_closed_ms: int | None = None
    failure: str | None = None  # playback problem (audio.failed, watchdog, ...), not a verdict
    audio_id: str | None = None  # the answer's archived Ogg Opus (gateway/archive), if kept
    assessment_shed: str | None = None  # why the ASR queue shed the step's utterance
    response_latency_ms: int | None = None  # window open -> speech start (STEPS tasks)
    step_completed: int | None = None  # 1: ran to its end with a transcript; 0: cut short

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = metrics_to_list(value) if f.name == "metrics" else value
        return out


Record = InstanceRecord | StepRecord  # one row update, either kind


@dataclass(frozen=True, slots=True)
class ArchivedAudio:
    """One row of the ``audio`` table: an archived answer (blob ``audio_id``) and whose it is."""

    audio_id: str
    device: str
    instance_id: str
    step_index: int
    created_ms: int  # epoch ms (retention)
    size_bytes: int  # the Ogg file (per-device quota)
    duration_ms: int


def metrics_to_list(metrics: tuple[StoredMetric, ...]) -> list[dict[str, object]]:
    return [{"method": m.method, "value": m.value} for m in metrics]


def metrics_to_text(metrics: tuple[StoredMetric, ...]) -> str:
    if not metrics:  # every row the runtime writes (metrics come from the side path)
        return "[]"
    return json.dumps(metrics_to_list(metrics), separators=(",", ":"), allow_nan=False)


def metrics_from_text(text: str | None) -> tuple[StoredMetric, ...]:
    """Parse stored metrics; anything malformed reads as no metrics."""
    try:
        items = json.loads(text or "[]")
        return tuple(
            StoredMetric(str(item["method"]), float(item["value"]))
            for item in items
            if isinstance(item, dict)
        )
    except (ValueError, TypeError, KeyError):
        return ()


def merge_instance(old: InstanceRecord, new: InstanceRecord) -> InstanceRecord:
    """``new`` applied on top of ``old`` (same key), by the rules in the module docstring."""
    if old.instance_id != new.instance_id:
        raise ValueError(f"cannot merge instance {new.instance_id} into {old.instance_id}")
    merged = {f.name: _pick(getattr(new, f.name), getattr(old, f.name)) for f in fields(new)}
    merged["created_ms"] = _pick(old.created_ms, new.created_ms)
    if new.state is not None:
        merged["reason"] = new.reason
    return InstanceRecord(**merged)  # type: ignore[arg-type]  # same fields, same types


def merge_step(old: StepRecord, new: StepRecord) -> StepRecord:
    """``new`` applied on top of ``old`` (same key), by the rules in the module docstring."""
    if (old.instance_id, old.step_index) != (new.instance_id, new.step_index):
        raise ValueError(
            f"cannot merge step {new.instance_id}/{new.step_index} "
            f"into {old.instance_id}/{old.step_index}"
        )
    merged = {f.name: _pick(getattr(new, f.name), getattr(old, f.name)) for f in fields(new)}
    merged["metrics"] = new.metrics or old.metrics
    return StepRecord(**merged)  # type: ignore[arg-type]  # same fields, same types


def _pick(preferred: object, fallback: object) -> object:
    return fallback if preferred is None else preferred
