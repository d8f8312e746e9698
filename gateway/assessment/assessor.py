"""Pure glue from (expected text, ASR text, method names) to metrics and the assessment record.

Missing or empty inputs, an unknown method, or any error inside a method yield no metric for
it: ``assess`` never raises, so nothing downstream (and never the stepping clock) can fail
because of it (SPEC §2.2, §2.4, §6).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.assessment.similarity import METHODS, MetricValue, norm

log = logging.getLogger(__name__)

DEFAULT_METHODS: tuple[str, ...] = ("text_similarity_v0",)


def _present(text: str | None) -> str | None:
    """The text if it has anything left after normalisation, else ``None`` (= missing)."""
    if not isinstance(text, str) or not norm(text):
        return None
    return text


def assess(
    expected_text: str | None,
    asr_text: str | None,
    methods: Sequence[str] = DEFAULT_METHODS,
) -> list[MetricValue]:
    """Run each named method; ``[]`` when either text is missing (silence, no transcript)."""
    expected = _present(expected_text)
    heard = _present(asr_text)
    if expected is None or heard is None:
        return []
    out: list[MetricValue] = []
    for name in methods:
        method = METHODS.get(name)
        if method is None:
            log.warning("unknown assessment method %r skipped", name)
            continue
        try:
            value = float(method(heard, expected))
        except Exception:  # a broken method must not escape into the caller
            log.exception("assessment method %r failed", name)
            continue
        if math.isfinite(value):
            out.append(MetricValue(name, value))
    return out


@dataclass(frozen=True, slots=True)
class AssessmentRecord:
    """The fields of the SPEC §6 assessment message (the wire model lives in ``topics``)."""

    instance_id: str
    step_index: int
    device: str
    prompt_text: str | None
    expected_text: str | None
    asr_text: str | None
    metrics: tuple[MetricValue, ...] = field(default=())
    assessed_at: int | None = None  # epoch ms

    def as_dict(self) -> dict[str, Any]:
        return {
            "v": 1,
            "instance_id": self.instance_id,
            "step_index": self.step_index,
            "device": self.device,
            "prompt_text": self.prompt_text,
            "expected_text": self.expected_text,
            "asr_text": self.asr_text,
            "metrics": [m.to_wire() for m in self.metrics],
            "assessed_at": self.assessed_at,
        }


def build_record(
    *,
    instance_id: str,
    step_index: int,
    device: str,
    prompt_text: str | None,
    expected_text: str | None,
    asr_text: str | None,
    assessed_at: int,
    methods: Sequence[str] = DEFAULT_METHODS,
) -> AssessmentRecord:
    """Assess and package in one step; ``assessed_at`` (epoch ms) is an input, not read here."""
    return AssessmentRecord(
        instance_id=instance_id,
        step_index=step_index,
        device=device,
        prompt_text=prompt_text,
        expected_text=expected_text,
        asr_text=asr_text,
        metrics=tuple(assess(expected_text, asr_text, methods)),
        assessed_at=assessed_at,
    )
