"""OTA rate limits, pure (time is an input): token buckets per client IP and per device
claim (the OTA shell keys it by MAC and Client-Id, so a spoofer of a board's MAC cannot drain
the real board's bucket).

The tables are keyed by attacker-chosen input (source addresses, MACs), so they are bounded:
at ``max_keys`` a new key may only take the place of the least recently charged key, and only
when that key's bucket has refilled completely (forgetting a full bucket loses nothing: a new
one starts full too). When the oldest bucket is still draining, the new key is refused as
limited: a flood of fresh keys can neither grow the table nor reset someone's bucket.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from enum import StrEnum

from gateway.xiaozhi.ratelimit import TokenBucket


class Limited(StrEnum):
    """Why a request was refused before it reached the trust book (metric label)."""

    IP = "rate_ip"
    MAC = "rate_mac"


class KeyedLimiter:
    """One :class:`TokenBucket` per key, at most ``max_keys`` of them (see module doc)."""

    def __init__(self, *, rate_per_s: float, burst: float, max_keys: int) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be >= 1")
        TokenBucket(rate_per_s, burst)  # validates the parameters once, up front
        self._rate = rate_per_s
        self._burst = burst
        self._max = max_keys
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def allow(self, key: str, now: float) -> bool:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self._max and not self._evict_oldest(now):
                return False
            bucket = self._buckets[key] = TokenBucket(self._rate, self._burst)
        self._buckets.move_to_end(key)
        return bucket.allow(now)

    def _evict_oldest(self, now: float) -> bool:
        key, bucket = next(iter(self._buckets.items()))
        if bucket.level(now) < self._burst:
            return False
        del self._buckets[key]
        return True


@dataclass(frozen=True, slots=True)
class OtaLimitConfig:
    ip_per_min: float
    ip_burst: int
    mac_per_min: float
    mac_burst: int
    max_keys: int


class OtaLimits:
    """Per-IP, then per-MAC: the IP bucket is charged first, so one host sending random MACs
    exhausts its own bucket without filling the MAC table."""

    def __init__(self, config: OtaLimitConfig) -> None:
        self._ip = KeyedLimiter(
            rate_per_s=config.ip_per_min / 60, burst=config.ip_burst, max_keys=config.max_keys
        )
        self._mac = KeyedLimiter(
            rate_per_s=config.mac_per_min / 60, burst=config.mac_burst, max_keys=config.max_keys
        )

    def check(self, *, ip: str, dev: str, now: float) -> Limited | None:
        if not self._ip.allow(ip, now):
            return Limited.IP
        if not self._mac.allow(dev, now):
            return Limited.MAC
        return None
