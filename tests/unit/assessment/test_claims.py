"""Decode on demand (gateway/assessment/claims.py): which windows' answers the ASR can take."""

from __future__ import annotations

import pytest

from gateway.assessment.claims import AnswerClaims, ClaimsConfig


def test_cold_only_the_free_places_are_claimed() -> None:
    claims = AnswerClaims()
    assert [claims.claim(f"d{i}", 0.0, free_places=2) for i in range(3)] == [True, True, False]
    assert len(claims) == 2
    assert not claims.claim("d9", 0.0, free_places=-3)  # an over-full queue counts as none


def test_a_device_holds_one_claim_and_releasing_frees_it() -> None:
    claims = AnswerClaims()
    assert claims.claim("a", 0.0, 1)
    assert claims.claim("a", 1.0, 1)  # its next window replaces the claim
    assert not claims.claim("b", 1.0, 1)
    claims.release("a", 3.0)
    assert claims.window_s == 2.0  # the first released window sets the length
    claims.release("a", 4.0)  # released twice: nothing more
    assert claims.window_s == 2.0
    assert claims.claim("b", 4.0, 1)


def test_the_asr_throughput_over_a_window_adds_claims() -> None:
    claims = AnswerClaims(ClaimsConfig(horizon_s=10.0, smoothing=0.5))
    assert claims.claim("w", 0.0, 1)
    claims.release("w", 2.0)  # windows last 2 s
    for i in range(50):  # 5 answers a second over the last 10 s
        claims.completed(i * 0.2)
    assert claims.rate(10.0) == 5.0
    assert claims.allowed(10.0, free_places=0) == 10.0  # what the ASR finishes in 2 s
    assert sum(claims.claim(f"d{i}", 10.0, 0) for i in range(20)) == 10
    claims.release("d0", 14.0)  # a 4 s window: the smoothed length moves halfway
    assert claims.window_s == 3.0
    assert claims.rate(30.0) == 0.0  # nothing finished lately: the rate falls back


def test_an_unreleased_claim_lapses_and_the_bounds_hold() -> None:
    claims = AnswerClaims(ClaimsConfig(ttl_s=60.0, max_claims=2, max_samples=3))
    assert claims.claim("cut-short", 0.0, 5)
    assert claims.claim("b", 30.0, 5)
    assert not claims.claim("c", 30.0, 5)  # max_claims, whatever the room
    assert claims.claim("c", 61.0, 5)  # the first claim lapsed: its place is free
    assert len(claims) == 2
    for t in range(10):
        claims.completed(100.0 + t)
    assert claims.rate(110.0) == 0.3  # only the last 3 stamps kept


@pytest.mark.parametrize(
    "kwargs",
    [{"horizon_s": 0}, {"ttl_s": -1}, {"smoothing": 0}, {"smoothing": 1.5},
     {"max_claims": 0}, {"max_samples": 0}],
)  # fmt: skip
def test_a_nonsensical_config_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        ClaimsConfig(**kwargs)  # type: ignore[arg-type]
