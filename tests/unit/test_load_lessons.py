"""The lessons harness's pure parts: several gateways' metrics as one (bench/load/lessons.py),
which CPUs a run's gateways get (bench/load/procs.py)."""

from __future__ import annotations

from bench.load.lessons import merged_metrics
from bench.load.procs import cpu_plan


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


def test_each_gateway_gets_a_cpu_of_its_own_only_when_one_is_left_for_the_rest() -> None:
    assert cpu_plan([0, 1], 1) == ([1], [0])
    assert cpu_plan([0, 1], 2) is None  # nothing left for the broker and the boards
    assert cpu_plan([0, 1, 2, 3], 2) == ([3, 2], [0, 1])
    assert cpu_plan([3, 0, 2], 2) == ([3, 2], [0])  # an affinity mask in any order
    assert cpu_plan([5], 1) is None
