"""Merge rules of records (the in-memory twin of the SQL upsert) and their JSON views."""

from __future__ import annotations

import json
import math

import pytest

from gateway.store.records import (
    InstanceRecord,
    InstanceState,
    StepRecord,
    StoredMetric,
    merge_instance,
    merge_step,
    metrics_from_text,
    metrics_to_text,
)

M1 = (StoredMetric("text_similarity_v0", 0.5),)
M2 = (StoredMetric("text_similarity_v0", 0.9),)
VERDICTS = {"passed", "grade", "level", "good", "bad", "retry_count", "score"}


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        # empty metrics keep existing non-empty ones
        (StepRecord("i", 0, metrics=M1), StepRecord("i", 0, asr_text="hi"), M1),
        # non-empty replaces
        (StepRecord("i", 0, metrics=M1), StepRecord("i", 0, metrics=M2), M2),
        # nothing anywhere stays nothing
        (StepRecord("i", 0), StepRecord("i", 0), ()),
        (StepRecord("i", 0), StepRecord("i", 0, metrics=M2), M2),
    ],
)
def test_step_metrics_rule(old: StepRecord, new: StepRecord, expected: tuple[StoredMetric]) -> None:
    assert merge_step(old, new).metrics == expected


def test_step_none_fields_keep_and_values_replace() -> None:
    old = StepRecord("i", 2, prompt_text="/a/b/01.mp3", asr_text="hello", played_ms=10)
    new = StepRecord("i", 2, asr_text="hello there", window_closed_ms=99)
    merged = merge_step(old, new)
    assert merged == StepRecord(
        "i", 2, prompt_text="/a/b/01.mp3", asr_text="hello there", played_ms=10, window_closed_ms=99
    )


def test_instance_rules() -> None:
    first = InstanceRecord("i", device_id="d", state=InstanceState.RUNNING, created_ms=1)
    paused = merge_instance(
        first, InstanceRecord("i", state=InstanceState.PAUSED, reason="offline", created_ms=5)
    )
    assert (paused.state, paused.reason, paused.created_ms, paused.device_id) == (
        InstanceState.PAUSED,
        "offline",
        1,  # the first created_ms wins
        "d",
    )
    # a partial update without a state keeps state and reason
    kept = merge_instance(paused, InstanceRecord("i", current_step=3))
    assert (kept.state, kept.reason, kept.current_step) == (InstanceState.PAUSED, "offline", 3)
    # a state without a reason clears the reason of the previous state
    resumed = merge_instance(kept, InstanceRecord("i", state=InstanceState.RUNNING))
    assert (resumed.state, resumed.reason) == (InstanceState.RUNNING, None)
    cancelled = merge_instance(
        resumed, InstanceRecord("i", state=InstanceState.CANCELLED, reason="preempted")
    )
    assert (cancelled.state, cancelled.reason) == (InstanceState.CANCELLED, "preempted")


def test_merge_refuses_other_keys() -> None:
    with pytest.raises(ValueError, match="cannot merge"):
        merge_instance(InstanceRecord("a"), InstanceRecord("b"))
    with pytest.raises(ValueError, match="cannot merge"):
        merge_step(StepRecord("a", 0), StepRecord("a", 1))


def test_metric_values_are_finite_numbers() -> None:
    with pytest.raises(ValueError, match="not finite"):
        StoredMetric("m", math.nan)
    assert metrics_from_text(metrics_to_text(M1 + M2)) == M1 + M2


@pytest.mark.parametrize("text", [None, "", "not json", "{}", '[{"method": "m"}]', "[1, 2]"])
def test_malformed_stored_metrics_read_as_none(text: str | None) -> None:
    assert metrics_from_text(text) == ()


def test_json_views_carry_spec_names_and_no_verdicts() -> None:
    inst = InstanceRecord("i", device_id="d", state=InstanceState.COMPLETED, resume="{}")
    step = StepRecord("i", 0, prompt_text="/p", expected_text="Hi.", asr_text="hi", metrics=M1)
    ij, sj = inst.to_json(), step.to_json()
    assert ij["instance_id"] == "i"
    assert ij["device"] == "d"
    assert ij["state"] == "completed"
    assert "resume" not in ij
    assert sj["metrics"] == [{"method": "text_similarity_v0", "value": 0.5}]
    assert {"prompt_text", "expected_text", "asr_text", "assessed_at"} <= set(sj)
    assert not (set(ij) | set(sj)) & VERDICTS


def test_no_metrics_is_the_empty_list_the_upsert_keeps_stored_metrics_for() -> None:
    # schema.UPSERT_STEP keeps the stored metrics when the new row's are exactly '[]'
    assert metrics_to_text(()) == "[]" == json.dumps([], separators=(",", ":"))
    assert metrics_from_text(metrics_to_text(())) == ()
