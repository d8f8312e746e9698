"""Per-session datagram rate limit: a token bucket, pure (time is an input).

A device sends one 60 ms frame per datagram, about 17 a second, plus a burst of buffered
wake-word audio when a conversation starts. The UDP endpoint charges every datagram that passed
the cheap routing checks to its session's bucket *before* any crypto or decoding, so a device
(or someone replaying its ssrc from its address) that sends faster than ``rate`` only spends
the gateway a dictionary lookup per excess datagram, and the loop keeps reading the shared
socket quickly enough for everyone else.
"""

from __future__ import annotations

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
        self.tokens = self.level(now)
        if self.last is None or now > self.last:
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
