"""text_similarity_v0, the method registry and the assessor: numbers only, never raising."""

from __future__ import annotations

import difflib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.assessment import similarity
from gateway.assessment.assessor import AssessmentRecord, assess, build_record
from gateway.assessment.similarity import MetricValue, norm, text_similarity_v0


@pytest.mark.parametrize(
    ("raw", "normed"),
    [
        ("Good morning.", "goodmorning"),
        ("  How ARE you?! ", "howareyou"),
        ("你好\uff0c世界\uff01", "你好世界"),  # fullwidth comma and exclamation mark
        ("I like 苹果。", "ilike苹果"),
        ("tab\tand\u3000ideographic space", "tabandideographicspace"),
        ("«quoted» — dash", "quoteddash"),
        ("", ""),
    ],
)
def test_norm_strips_case_punctuation_and_space(raw: str, normed: str) -> None:
    assert norm(raw) == normed


@pytest.mark.parametrize(
    ("asr", "expected", "value"),
    [
        ("good morning", "Good morning.", 1.0),
        ("GOOD, MORNING!", "good morning", 1.0),
        ("cat", "hat", 2 * 2 / 6),
        ("abc", "xyz", 0.0),
        ("我喜欢苹果", "我喜欢苹果。", 1.0),
        ("我喜欢香蕉", "我喜欢苹果", 2 * 3 / 10),
    ],
)
def test_text_similarity_v0_values(asr: str, expected: str, value: float) -> None:
    assert text_similarity_v0(asr, expected) == pytest.approx(value)


@given(st.text(max_size=40), st.text(max_size=40))
def test_similarity_is_the_specified_ratio_in_unit_range(a: str, b: str) -> None:
    r = text_similarity_v0(a, b)
    assert 0.0 <= r <= 1.0
    assert r == difflib.SequenceMatcher(None, norm(a), norm(b)).ratio()


def test_assess_returns_one_metric_in_wire_shape() -> None:
    out = assess("The cat is sleeping.", "the cat is sleeping")
    assert out == [MetricValue("text_similarity_v0", 1.0)]
    assert [m.to_wire() for m in out] == [{"method": "text_similarity_v0", "value": 1.0}]


@pytest.mark.parametrize(
    ("expected", "heard"),
    [
        (None, "hi"),
        ("hi", None),
        (None, None),
        ("hi", ""),
        ("", "hi"),
        ("hi", " ?! "),
        ("...", "hi"),
    ],
)
def test_missing_or_empty_inputs_give_no_metrics(expected: str | None, heard: str | None) -> None:
    assert assess(expected, heard) == []


def test_unknown_and_failing_methods_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(_a: str, _b: str) -> float:
        raise ValueError("boom")

    registry = dict(similarity.METHODS)
    registry["broken_v0"] = broken
    registry["nan_v0"] = lambda _a, _b: float("nan")
    monkeypatch.setattr("gateway.assessment.assessor.METHODS", registry)
    out = assess("hi", "hi", ["nope", "broken_v0", "nan_v0", "text_similarity_v0"])
    assert out == [MetricValue("text_similarity_v0", 1.0)]


def test_assess_never_raises_on_wrong_types() -> None:
    assert assess(123, b"hi") == []  # type: ignore[arg-type]


def test_record_has_exactly_the_spec_fields_and_no_verdict() -> None:
    record = build_record(
        instance_id="i-1",
        step_index=2,
        device="aa:bb",
        prompt_text="lessons/unit01/03.mp3",
        expected_text="I like apples.",
        asr_text="i like apples",
        assessed_at=1_700_000_000_000,
    )
    wire = record.as_dict()
    assert list(wire) == [
        "v",
        "instance_id",
        "step_index",
        "device",
        "prompt_text",
        "expected_text",
        "asr_text",
        "metrics",
        "assessed_at",
    ]
    assert wire["metrics"] == [{"method": "text_similarity_v0", "value": 1.0}]
    text = json.dumps(wire)
    for verdict in ("passed", "grade", "level", "good", "bad", "retry_count", "threshold"):
        assert verdict not in text


def test_record_without_expected_text_has_empty_metrics() -> None:
    record = build_record(
        instance_id="i-1",
        step_index=0,
        device="aa:bb",
        prompt_text="lessons/unit01/01.mp3",
        expected_text=None,
        asr_text="good morning",
        assessed_at=1,
    )
    assert record == AssessmentRecord(
        "i-1", 0, "aa:bb", "lessons/unit01/01.mp3", None, "good morning", (), 1
    )
    assert record.as_dict()["metrics"] == []
