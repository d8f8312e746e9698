"""Quantiles as every benchmark here reports them (nearest rank)."""

from __future__ import annotations

import math


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
