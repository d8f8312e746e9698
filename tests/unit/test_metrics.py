from __future__ import annotations

import math

import pytest

from gateway.metrics import Metrics


def test_quantiles_nearest_rank_over_bounded_window() -> None:
    m = Metrics()
    q = m.quantiles("lateness_ms", "test", window=100)
    for v in range(1, 201):  # only the last 100 (101..200) stay in the window
        q.observe(float(v))
    assert q.quantile(0.5) == 150.0
    assert q.quantile(0.99) == 199.0
    assert q.summary()["max"] == 200.0
    assert q.summary()["count"] == 200.0


def test_empty_quantiles_omit_nan_stats_from_snapshot() -> None:
    m = Metrics()
    q = m.quantiles("empty", "test")
    assert math.isnan(q.quantile(0.5))
    snap = m.snapshot()
    assert 'snlpgw_empty{stat="p50"}' not in snap
    assert snap['snlpgw_empty{stat="count"}'] == 0.0


def test_snapshot_and_exposition_carry_labelled_counters() -> None:
    m = Metrics()
    c = m.counter("udp_dropped", "drops", ["reason"])
    c.labels("replay").inc(3)
    assert m.snapshot()['snlpgw_udp_dropped_total{reason="replay"}'] == 3.0
    assert b'snlpgw_udp_dropped_total{reason="replay"} 3.0' in m.exposition()
    assert b"_created" not in m.exposition()


def test_counter_inc_keeps_prometheus_checks() -> None:
    m = Metrics()
    plain = m.counter("plain", "unlabelled")
    plain.inc()
    plain.inc(2.5)
    labelled = m.counter("labelled", "labelled", ["kind"])
    labelled.labels("a").inc()
    labelled.labels("a").inc(0)
    labelled.labels("b").inc(1, exemplar={"trace": "t1"})  # the checked path, exemplar kept
    snap = m.snapshot()
    assert snap["snlpgw_plain_total"] == 3.5
    assert snap['snlpgw_labelled_total{kind="a"}'] == 1.0
    assert snap['snlpgw_labelled_total{kind="b"}'] == 1.0
    with pytest.raises(ValueError, match="missing label values"):
        labelled.inc()  # the parent of labelled children counts nothing
    with pytest.raises(ValueError, match="non-negative"):
        plain.inc(-1)
