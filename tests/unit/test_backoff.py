"""The one back-off policy (gateway/backoff.py): the schedules every retry loop had by hand."""

from __future__ import annotations

import random

import pytest

from gateway.backoff import BackoffPolicy, FailureStreak


class Draws(random.Random):
    """Jitter draws chosen by the test."""

    def __init__(self, *draws: float) -> None:
        super().__init__(0)
        self._draws = list(draws)

    def random(self) -> float:
        return self._draws.pop(0)


def test_mqtt_reconnect_is_capped_full_jitter_above_the_minimum_and_resets() -> None:
    streak = FailureStreak(BackoffPolicy(0.5, 4.0, jitter=True))
    delays = [streak.failed() for _ in range(10)]
    assert all(0.5 <= d <= 4.0 for d in delays)
    assert streak.failures == 10
    streak.reset()
    assert streak.failed() == 0.5  # first failure: ceiling == minimum, nothing to jitter


def test_jitter_spreads_between_the_minimum_and_the_doubling_ceiling() -> None:
    policy = BackoffPolicy(0.5, 15.0, jitter=True)
    # ceilings 0.5, 1, 2, 4, 8, 15 (capped): draw 0 gives the minimum, draw ~1 the ceiling
    assert policy.delay(3, Draws(0.0)) == 0.5
    assert policy.delay(3, Draws(0.5)) == 0.5 + 0.5 * (2.0 - 0.5)
    assert policy.delay(6, Draws(0.999)) == pytest.approx(0.5 + 0.999 * 14.5)


def test_manager_reporter_schedule_doubles_to_its_cap() -> None:
    policy = BackoffPolicy(0.5, 10.0)  # store.reporter defaults: backoff_s, backoff_max_s
    assert [policy.delay(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_http_asr_schedule_doubles_without_cap() -> None:
    policy = BackoffPolicy(0.2)  # the retry budget bounds it
    assert [policy.delay(n) for n in range(1, 5)] == [0.2, 0.4, 0.8, 1.6]


def test_asr_slot_restart_schedule_is_the_old_half_second_doubling() -> None:
    policy = BackoffPolicy(1.0, 30.0)
    assert [policy.delay(f) for f in range(1, 12)] == [min(30.0, 0.5 * 2**f) for f in range(1, 12)]


def test_a_streak_of_any_length_stays_at_the_cap() -> None:
    """2.0 ** 1024 overflows: a broker away for hours (15 s cap) must not crash the loop."""
    streak = FailureStreak(BackoffPolicy(0.5, 15.0, jitter=True), failures=5000, rng=Draws(0.0))
    assert streak.failed() == 0.5
    assert BackoffPolicy(0.5, 15.0).delay(100_000) == 15.0


def test_a_minimum_over_the_cap_keeps_each_loops_old_answer() -> None:
    # Jittered (MQTT): never below the minimum. Plain (reporter, chat): the cap wins.
    assert BackoffPolicy(5.0, 1.0, jitter=True).delay(4, Draws(0.7)) == 5.0
    assert BackoffPolicy(5.0, 1.0).delay(4) == 1.0


def test_failures_count_from_one() -> None:
    with pytest.raises(ValueError, match="from 1"):
        BackoffPolicy(1.0).delay(0)
