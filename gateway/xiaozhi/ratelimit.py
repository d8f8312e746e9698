"""Per-session datagram rate limit: a token bucket, pure (time is an input).

A device sends one 60 ms frame per datagram, about 17 a second, plus a burst of buffered
wake-word audio when a conversation starts. The UDP endpoint charges a datagram to its
session's bucket after the cheap routing, source and sequence checks (so replays, which could
come from anyone who captured traffic, never spend the session's budget) and *before* any
crypto or decoding, so a device that sends fresh sequence numbers faster than ``rate`` only
spends the gateway a few comparisons per excess datagram, and the loop keeps reading the
shared socket quickly enough for everyone else. :class:`HelloLimiter` budgets hellos per device.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(slots=True)
class TokenBucket:
    rate: float  # tokens per second
    burst: float  # bucket size
    tokens: float = -1.0  # -1: start full
    last: float | None = None

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        if self.tokens < 0:
            self.tokens = self.burst

    def allow(self, now: float) -> bool:
        """Take one token if there is one; refill by elapsed time first."""
        last = self.last  # level(now), inline: this runs for every datagram
        if last is None or now > last:
            if last is not None:
                self.tokens = min(self.burst, self.tokens + (now - last) * self.rate)
            self.last = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False

    def level(self, now: float) -> float:
        """Tokens there would be at ``now`` (nothing taken, nothing changed)."""
        if self.last is not None and now > self.last:
            return min(self.burst, self.tokens + (now - self.last) * self.rate)
        return self.tokens


class HelloLimiter:
    """Per-device hello budget with a bounded table (pure; time is an input).

    A hello costs a fresh key, a session, an audio task and a reply, so each device gets
    ``burst`` hellos and then one per ``1 / rate`` seconds (firmware says hello once per
    conversation). The table keeps at most ``capacity`` devices; past that the least recently
    seen one is forgotten, which only ever gives that device a fresh budget, so many ids can
    grow neither the table nor anyone else's wait.
    """

    def __init__(self, *, rate: float, burst: float, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        TokenBucket(rate=rate, burst=burst)  # validates rate and burst
        self.rate = rate
        self.burst = burst
        self.capacity = capacity
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def allow(self, dev: str, now: float) -> bool:
        bucket = self._buckets.get(dev)
        if bucket is None:
            bucket = TokenBucket(rate=self.rate, burst=self.burst)
            self._buckets[dev] = bucket
            if len(self._buckets) > self.capacity:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(dev)
        return bucket.allow(now)
