"""The retained ops snapshot, capped in bytes (pure: metrics map in, JSON bytes out).

Mosquitto disconnects a client that publishes a packet over its ``max_packet_size`` (65536 in
the project's config), so a snapshot that grew past it would cost the gateway its connection
at every interval. Labels fed by devices are bounded (``gateway.labels``), but the snapshot is
capped as well: when the whole map does not fit in ``max_bytes``, detail goes first, counted in
the snapshot itself as ``snlpgw_ops_snapshot_series_dropped``:

1. histogram buckets (``*_bucket{…}``: the ``_sum`` and ``_count`` stay),
2. then labelled series, whole metric families at a time, the family with most series first,
3. unlabelled figures (totals, gauges) last, largest key first, only if they alone do not fit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from topics import OpsMetrics, encode

DROPPED_KEY = "snlpgw_ops_snapshot_series_dropped"


def _entry_bytes(key: str, value: float) -> int:
    # `"key":value,` in compact JSON (pydantic writes floats like json.dumps does)
    return len(json.dumps(key, ensure_ascii=False).encode()) + len(json.dumps(value)) + 2


def _family(key: str) -> str:
    return key.split("{", 1)[0]


def _build(metrics: Mapping[str, float], gateway_id: str, ts: int, interval_s: float) -> bytes:
    body = OpsMetrics.from_snapshot(metrics, gateway_id=gateway_id, ts=ts, interval_s=interval_s)
    return encode(body)


def capped_snapshot(
    metrics: Mapping[str, float],
    *,
    gateway_id: str,
    ts: int,
    interval_s: float,
    max_bytes: int,
) -> tuple[bytes, int]:
    """The encoded snapshot (at most ``max_bytes``) and how many series were left out."""
    full = _build(metrics, gateway_id, ts, interval_s)
    if len(full) <= max_bytes:
        return full, 0
    plain = {k: v for k, v in metrics.items() if "{" not in k}
    families: dict[str, dict[str, float]] = {}
    buckets: dict[str, float] = {}
    for key, value in metrics.items():
        if "{" not in key:
            continue
        if _family(key).endswith("_bucket"):
            buckets[key] = value
        else:
            families.setdefault(_family(key), {})[key] = value
    # Fill the budget with the cheapest detail first: plain figures, then families from the
    # smallest (the flood is in the biggest), then buckets. The estimate is exact for the map;
    # the final encode below checks it anyway.
    overhead = len(_build({DROPPED_KEY: 0.0}, gateway_id, ts, interval_s)) + 16
    budget = max_bytes - overhead
    kept: dict[str, float] = {}
    used = 0
    for key in sorted(plain, key=lambda k: _entry_bytes(k, plain[k])):
        cost = _entry_bytes(key, plain[key])
        if used + cost <= budget:
            kept[key] = plain[key]
            used += cost
    groups = [*sorted(families.values(), key=len), buckets]
    for group in groups:
        cost = sum(_entry_bytes(k, v) for k, v in group.items())
        if group and used + cost <= budget:
            kept.update(group)
            used += cost
    while True:
        dropped = len(metrics) - len(kept)
        body = _build({**kept, DROPPED_KEY: float(dropped)}, gateway_id, ts, interval_s)
        if len(body) <= max_bytes or not kept:
            return body, dropped
        kept.pop(
            max(kept, key=lambda k: _entry_bytes(k, kept[k]))
        )  # pragma: no cover - the estimate holds
