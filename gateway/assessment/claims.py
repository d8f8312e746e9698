"""Decode on demand: which lesson windows' answers the ASR can take, decided when they open.

A lesson listen window's audio is worth decoding (Opus decode + VAD, the biggest share of a
speaking step's CPU) only if its answer will be assessed. With more children answering than ASR
cores can transcribe, the bounded ASR queue sheds most answers after they were decoded, and at
1,000 speaking lessons that decoding was a third of the gateway's CPU and made the lessons'
timers late. So each window *claims* a place for its answer when it opens; a refused window is
only captured (its Opus packets archived for ``snlpgw reassess``, no decode) and its step is
stored ``assessment_shed = "asr_saturated"``.

How many windows may hold a claim: the places free in the queue now, plus what the ASR will
have finished by the time a window opening now closes (its completion rate over the last
``horizon_s``, times how long windows last, each smoothed). Counting only the free places would
starve a well-provisioned ASR (32 places for windows of ~2 s caps it at ~16 answers a second);
counting nothing would decode answers the queue then sheds. Cold (no rate measured yet), only
the free places count, and the claims grow with the ASR's measured throughput.

Pure: time is an input (monotonic seconds). Bounded: at most ``max_claims`` claims (the device
count can be any size), ``max_samples`` completion stamps.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ClaimsConfig:
    horizon_s: float = 10.0  # completions counted over this long for the ASR's rate
    ttl_s: float = 120.0  # a claim never released (its lesson cut short) lapses
    smoothing: float = 0.1  # EWMA weight of each released window's length
    max_claims: int = 10_000
    max_samples: int = 4_096

    def __post_init__(self) -> None:
        if self.horizon_s <= 0 or self.ttl_s <= 0 or not 0 < self.smoothing <= 1:
            raise ValueError("horizon_s and ttl_s must be > 0, smoothing in (0, 1]")
        if self.max_claims < 1 or self.max_samples < 1:
            raise ValueError("max_claims and max_samples must be >= 1")


class AnswerClaims:
    """Claims of open windows on the ASR's capacity (keys: device ids, one window each)."""

    def __init__(self, config: ClaimsConfig | None = None) -> None:
        self.config = config or ClaimsConfig()
        self._claims: OrderedDict[str, float] = OrderedDict()  # device -> claimed at, oldest first
        self._done: deque[float] = deque(maxlen=self.config.max_samples)  # completion stamps
        self.window_s = 0.0  # smoothed length of a released window (0: none released yet)

    def __len__(self) -> int:
        return len(self._claims)

    def rate(self, now: float) -> float:
        """ASR completions a second over the last ``horizon_s``."""
        done, since = self._done, now - self.config.horizon_s
        while done and done[0] < since:
            done.popleft()
        return len(done) / self.config.horizon_s

    def allowed(self, now: float, free_places: int) -> float:
        """How many windows may hold a claim now."""
        return max(0, free_places) + self.rate(now) * self.window_s

    def claim(self, key: str, now: float, free_places: int) -> bool:
        """A window of ``key`` opens: True (decode it) and a claim held until :meth:`release`,
        or False (capture it only). A key's earlier claim is replaced (one window at a time)."""
        claims = self._claims
        claims.pop(key, None)
        lapsed = now - self.config.ttl_s
        while claims and next(iter(claims.values())) < lapsed:
            claims.popitem(last=False)
        if len(claims) >= min(self.allowed(now, free_places), self.config.max_claims):
            return False
        claims[key] = now
        return True

    def release(self, key: str, now: float) -> None:
        """``key``'s window closed; its length feeds the smoothed window length."""
        claimed = self._claims.pop(key, None)
        if claimed is None:
            return
        length = now - claimed
        a = self.config.smoothing
        self.window_s = length if self.window_s == 0.0 else (1 - a) * self.window_s + a * length

    def completed(self, now: float) -> None:
        """The ASR finished a job (its rate)."""
        self._done.append(now)
