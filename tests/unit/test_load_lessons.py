"""The lessons harness's pure parts (bench/load/lessons.py): several gateways' metrics as one."""

from __future__ import annotations

from bench.load.lessons import merged_metrics


def test_counters_add_up_and_quantiles_take_the_worst_gateway() -> None:
    first = {
        "snlpgw_assessments_published_total": 3.0,
        "snlpgw_window_lateness_ms{stat=p99}": 4.0,
        "snlpgw_window_lateness_ms{stat=count}": 10.0,
        "snlpgw_only_here_total": 1.0,
    }
    second = {
        "snlpgw_assessments_published_total": 5.0,
        "snlpgw_window_lateness_ms{stat=p99}": 9.0,
        "snlpgw_window_lateness_ms{stat=count}": 7.0,
    }
    assert merged_metrics([first, second]) == {
        "snlpgw_assessments_published_total": 8.0,
        "snlpgw_window_lateness_ms{stat=p99}": 9.0,
        "snlpgw_window_lateness_ms{stat=count}": 17.0,
        "snlpgw_only_here_total": 1.0,
    }
    assert merged_metrics([first]) == first
