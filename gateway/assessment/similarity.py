"""Quantitative metrics over text: numbers only, never a verdict (SPEC §2.4, §6).

Every method is a pure function ``(asr_text, expected_text) -> float`` registered by name in
``METHODS``; adding a method later means adding one function and one registry entry.
"""

from __future__ import annotations

import difflib
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class MetricValue:
    """One number produced by one method; the only shape assessment output takes."""

    method: str
    value: float

    def to_wire(self) -> dict[str, str | float]:
        return {"method": self.method, "value": self.value}


def norm(text: str) -> str:
    """Lower-case; drop punctuation (P*), separators (Z*) and whitespace; any script."""
    return "".join(
        ch
        for ch in text.lower()
        if not ch.isspace() and unicodedata.category(ch)[0] not in ("P", "Z")
    )


def text_similarity_v0(asr_text: str, expected_text: str) -> float:
    """``SequenceMatcher(None, norm(asr), norm(expected)).ratio()`` in [0, 1]."""
    return difflib.SequenceMatcher(None, norm(asr_text), norm(expected_text)).ratio()


Method = Callable[[str, str], float]

METHODS: Mapping[str, Method] = MappingProxyType(
    {
        "text_similarity_v0": text_similarity_v0,
    }
)
