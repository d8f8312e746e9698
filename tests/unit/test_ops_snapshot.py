"""The retained snapshot stays under its byte cap by leaving out detail, counted."""

from __future__ import annotations

import json

from gateway.ops_snapshot import DROPPED_KEY, capped_snapshot


def _snap(metrics: dict[str, float], max_bytes: int) -> tuple[dict[str, float], int, int]:
    body, dropped = capped_snapshot(
        metrics, gateway_id="gw1", ts=1, interval_s=10.0, max_bytes=max_bytes
    )
    parsed: dict[str, float] = json.loads(body)["metrics"]
    return parsed, dropped, len(body)


def test_small_snapshot_is_whole_and_unmarked() -> None:
    metrics = {"snlpgw_a_total": 1.0, 'snlpgw_b_total{cmd="PLAY_MEDIA"}': 2.0}
    parsed, dropped, _ = _snap(metrics, 4096)
    assert parsed == metrics
    assert dropped == 0


def test_flood_family_goes_first_then_buckets_totals_stay() -> None:
    flood = {f'snlpgw_board_reports_total{{cmd="{i:05d}{"x" * 200}"}}': 1.0 for i in range(400)}
    small = {'snlpgw_board_events_total{evt="button"}': 3.0}
    buckets = {f'snlpgw_lat_bucket{{le="{i}"}}': float(i) for i in range(30)}
    plain = {"snlpgw_mqtt_connects_total": 1.0, "snlpgw_uptime_seconds": 5.0}
    metrics = {**flood, **small, **buckets, **plain}
    parsed, dropped, size = _snap(metrics, 4096)
    assert size <= 4096
    assert parsed[DROPPED_KEY] == dropped == len(flood)
    assert plain.items() <= parsed.items()
    assert small.items() <= parsed.items()
    assert buckets.items() <= parsed.items()
    # tighter: the buckets go too, the plain figures and the small family stay
    parsed, dropped, size = _snap(metrics, 1024)
    assert size <= 1024
    assert dropped == len(flood) + len(buckets)
    assert plain.items() <= parsed.items()


def test_only_plain_figures_that_fit_are_kept() -> None:
    metrics = {f"snlpgw_figure_{i:04d}_{'y' * 40}": float(i) for i in range(200)}
    parsed, dropped, size = _snap(metrics, 2048)
    assert size <= 2048
    assert 0 < dropped < len(metrics)
    assert len(parsed) - 1 == len(metrics) - dropped
