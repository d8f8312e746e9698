"""Quantiles as every benchmark here reports them (nearest rank): the benchmarks and the load
harness share this one, and :func:`record` to write their results."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {"count": 0}
    return {
        "count": len(samples),
        "p50": round(quantile(samples, 0.50), 2),
        "p90": round(quantile(samples, 0.90), 2),
        "p99": round(quantile(samples, 0.99), 2),
        "max": round(max(samples), 2),
        "min": round(min(samples), 2),
    }


def record(name: str, doc: dict[str, Any], markdown: str) -> None:
    """A benchmark's results: ``bench/results/NAME.json`` and ``NAME.md``, and the Markdown on
    stdout."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    (RESULTS / f"{name}.md").write_text(markdown, encoding="utf-8")
    sys.stdout.write(markdown + "\n")
