"""Start admission's pacer: a burst at once, then one start per interval, refusal past the wait."""

from __future__ import annotations

import itertools

import pytest

from gateway.tasks.core.admission import AdmissionConfig, StartPacer


def test_a_lone_start_goes_at_once() -> None:
    pacer = StartPacer(AdmissionConfig(rate_per_s=10, burst=1, max_wait_ms=1_000))
    assert pacer.reserve(5_000.0) == 5_000.0


def test_a_burst_goes_at_once_then_one_start_per_interval() -> None:
    pacer = StartPacer(AdmissionConfig(rate_per_s=100, burst=3, max_wait_ms=1_000))
    slots = [pacer.reserve(0.0) for _ in range(6)]
    assert slots == [0.0, 0.0, 0.0, 10.0, 20.0, 30.0]


def test_the_bucket_refills_over_a_lull() -> None:
    pacer = StartPacer(AdmissionConfig(rate_per_s=100, burst=3, max_wait_ms=1_000))
    for _ in range(3):
        pacer.reserve(0.0)
    assert pacer.reserve(10.0) == 10.0  # one interval later: one slot back
    assert pacer.reserve(10.0) == 20.0
    assert [pacer.reserve(1_000.0) for _ in range(4)] == [1_000.0, 1_000.0, 1_000.0, 1_010.0]


def test_a_start_that_would_wait_too_long_is_refused_and_reserves_nothing() -> None:
    pacer = StartPacer(AdmissionConfig(rate_per_s=10, burst=1, max_wait_ms=250))
    assert [pacer.reserve(0.0) for _ in range(3)] == [0.0, 100.0, 200.0]
    assert pacer.reserve(0.0) is None  # its slot, 300 ms ahead, is past the 250 ms wait
    assert pacer.reserve(0.0) is None
    assert pacer.reserve(60.0) == 300.0  # nothing was reserved by the refusals


def test_a_herd_of_a_thousand_is_spread_at_the_rate() -> None:
    pacer = StartPacer(AdmissionConfig())  # the shipped 500/s after a burst of 20, 5 s wait
    reserved = [pacer.reserve(0.0) for _ in range(1_000)]
    slots = [s for s in reserved if s is not None]
    assert len(slots) == 1_000
    assert slots[:20] == [0.0] * 20
    assert slots[-1] == pytest.approx(980 * 2.0)  # the last of the herd waits 1.96 s
    gaps = [b - a for a, b in itertools.pairwise(slots[19:])]
    assert min(gaps) == pytest.approx(2.0)
    assert max(gaps) == pytest.approx(2.0)


def test_a_slot_is_never_before_the_request() -> None:
    pacer = StartPacer(AdmissionConfig(rate_per_s=1_000, burst=5, max_wait_ms=0))
    for now in (0.0, 0.5, 3.0, 3.0, 3.0, 3.0, 3.0, 100.0):
        slot = pacer.reserve(now)
        assert slot is None or slot >= now


@pytest.mark.parametrize("fields", [{"rate_per_s": 0}, {"burst": 0}, {"max_wait_ms": -1}], ids=str)
def test_a_config_that_admits_nothing_is_refused(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="admission needs"):
        AdmissionConfig(**fields)  # type: ignore[arg-type]
