"""The one back-off policy of every retry loop: capped exponential, optionally full jitter.

Pure (no clock, no sleeping): a loop asks for the wait after its n-th failure in a row and does
its own waiting, so the policy fits the three shapes of loop the gateway has — retry one call a
bounded number of times (manager reporter, HTTP ASR engine), restart forever until a success
resets the streak (MQTT reconnect, ASR worker slots), and a gate that refuses until a time
(chat upstream). Delay after failure ``n`` (1 = the first)::

    ceiling = min(cap_s, first_s * 2 ** (n - 1))
    delay   = ceiling                                       without jitter
    delay   = first_s + U[0, 1) * max(0, ceiling - first_s)   with full jitter (never below first_s)

The exponent is clamped, so a streak of any length (a broker away for days) stays a float.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

_MAX_DOUBLINGS = 64  # 2**64 times any first_s is past every cap; 2.0**1024 would overflow


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    first_s: float
    cap_s: float = math.inf
    jitter: bool = False

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after the ``failures``-th failure in a row (``failures`` >= 1);
        ``rng`` draws the jitter (a policy without jitter never uses it)."""
        if failures < 1:
            raise ValueError(f"failures counts from 1, got {failures}")
        doublings = min(failures - 1, _MAX_DOUBLINGS)
        ceiling = min(self.cap_s, self.first_s * 2.0**doublings)
        if not self.jitter:
            return ceiling
        draw = (rng or random).random()
        return self.first_s + draw * max(0.0, ceiling - self.first_s)


@dataclass(slots=True)
class FailureStreak:
    """Consecutive failures of one loop under a policy; a success resets the streak."""

    policy: BackoffPolicy
    failures: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def failed(self) -> float:
        """Count one more failure; the seconds to wait before the next attempt."""
        self.failures += 1
        return self.policy.delay(self.failures, self.rng)

    def reset(self) -> None:
        self.failures = 0
