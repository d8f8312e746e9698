"""OTA rate limits (pure core, fake clock): bounded keyed token buckets."""

from __future__ import annotations

import pytest

from gateway.xiaozhi.ota.limits import KeyedLimiter, Limited, OtaLimitConfig, OtaLimits
from gateway.xiaozhi.ratelimit import TokenBucket


def test_each_key_has_its_own_bucket() -> None:
    lim = KeyedLimiter(rate_per_s=1.0, burst=2, max_keys=10)
    assert [lim.allow("a", 0) for _ in range(3)] == [True, True, False]
    assert lim.allow("b", 0)
    assert lim.allow("a", 1.0)  # refilled one token


def test_a_full_table_only_forgets_a_refilled_bucket() -> None:
    lim = KeyedLimiter(rate_per_s=1.0, burst=2, max_keys=2)
    assert lim.allow("a", 0)
    assert lim.allow("b", 0)
    assert not lim.allow("c", 0.5)  # "a" is still draining: the newcomer is refused
    assert len(lim) == 2
    assert lim.allow("c", 2.0)  # "a" refilled: it makes room
    assert len(lim) == 2
    assert lim.allow("a", 2.0)  # "a" comes back as new, full (evicting the refilled "b")


def test_recent_use_keeps_a_key() -> None:
    lim = KeyedLimiter(rate_per_s=1.0, burst=1, max_keys=2)
    lim.allow("a", 0)
    lim.allow("b", 0)
    assert not lim.allow("a", 0)  # "a" becomes the most recent key
    assert lim.allow("c", 5)  # evicts "b", the least recently charged
    assert lim.allow("a", 5)  # "a" is still there (refilled by now), not re-created
    assert len(lim) == 2


@pytest.mark.parametrize("args", [(1.0, 1, 0), (0.0, 1, 5), (1.0, 0, 5)])
def test_bad_parameters_are_refused(args: tuple[float, int, int]) -> None:
    with pytest.raises(ValueError, match="must be"):
        KeyedLimiter(rate_per_s=args[0], burst=args[1], max_keys=args[2])


def test_ip_bucket_is_charged_before_the_mac_bucket() -> None:
    limits = OtaLimits(
        OtaLimitConfig(ip_per_min=60, ip_burst=3, mac_per_min=60, mac_burst=1, max_keys=100)
    )
    assert limits.check(ip="1.2.3.4", dev="d1", now=0) is None
    assert limits.check(ip="1.2.3.4", dev="d1", now=0) is Limited.MAC
    assert limits.check(ip="1.2.3.4", dev="d2", now=0) is None
    assert limits.check(ip="1.2.3.4", dev="d3", now=0) is Limited.IP
    assert limits.check(ip="5.6.7.8", dev="d3", now=0) is None


def test_bucket_level_peeks_without_taking() -> None:
    bucket = TokenBucket(rate=1.0, burst=2)
    assert bucket.level(0) == 2
    bucket.allow(0)
    assert bucket.level(0.5) == 1.5
    assert bucket.level(0.5) == 1.5
    assert bucket.level(10) == 2
