"""Decode admission: which lesson listen windows get Opus decode + VAD when the loop cannot
keep up, and which are only captured (their Opus packets kept for the archive).

Why: decode + VAD is the biggest share of a speaking step's CPU (about 30 frames of 60 ms per
answer), and it shares one event loop with the lessons' timers and the MQTT connection. When
children answer faster than one core can decode, every part of that loop runs late: at 1,000
speaking lessons on one core the next clip started ~2-3 s late. The lessons' timing is the
product's promise ("on the timer play clip i+1, no matter what ASR or assessment did");
assessment is not. So under overload the gateway stops decoding *new* lesson windows rather
than letting the loop fall behind: a window opened capture-only keeps its device's Opus packets
(the learning record's archive stores them, ``snlpgw reassess`` assesses them later) and its
step is stored with ``assessment_shed = "voice_overload"``, counted. CHAT and STEPS (task DSL)
windows, which answer a child live, are always decoded.

The signal is the event loop's lag, taken CoDel-style (Nichols & Jacobson, "Controlling Queue
Delay", 2012): a probe timer every ``probe_ms`` measures how late it ran, and an interval counts
as overloaded only when *every* probe in it was late by more than ``target_ms`` (the minimum
lag of the interval above the target) — the loop was never idle once in that interval. A burst
(one long callback, a GC pause, a busy neighbour for a moment) leaves some probe on time and
changes nothing; a CI machine's CPU hog delays the gateway's wake-ups by far less than the
target. The decoded share follows AIMD (as TCP's window): halved after an overloaded interval,
raised by ``step`` after a calm one, so it settles near what the loop can carry and returns to
1 when the load goes. Windows are admitted deterministically in that proportion (an
accumulator, no random draw).

Pure: time and lag are inputs; :class:`LagProbe` is the small shell that measures them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from gateway.metrics import Metrics
from gateway.xiaozhi.voice_ports import Claim


@dataclass(frozen=True, slots=True)
class DecodeAdmissionConfig:
    """``target_ms`` 0: admission off (every window decoded)."""

    target_ms: float = 10.0
    interval_ms: float = 500.0
    step: float = 0.05
    decrease: float = 0.5

    def __post_init__(self) -> None:
        if self.target_ms < 0 or self.interval_ms <= 0:
            raise ValueError("target_ms must be >= 0 and interval_ms > 0")
        if not 0 < self.step <= 1 or not 0 < self.decrease < 1:
            raise ValueError("step must be in (0, 1] and decrease in (0, 1)")


class DecodeAdmission:
    """The decoded share of sheddable windows, from lag samples (times in ms, monotonic)."""

    def __init__(self, config: DecodeAdmissionConfig) -> None:
        self.config = config
        self.share = 1.0  # of sheddable windows decoded
        self.overloaded_intervals = 0
        self._interval_start: float | None = None
        self._min_lag = float("inf")
        self._credit = 0.0

    @property
    def enabled(self) -> bool:
        return self.config.target_ms > 0

    def observe(self, now_ms: float, lag_ms: float) -> bool | None:
        """One probe's lag; at the end of an interval, its verdict (True: overloaded) after
        the share moved; None within an interval."""
        if self._interval_start is None:
            self._interval_start = now_ms
        self._min_lag = min(self._min_lag, lag_ms)
        if now_ms - self._interval_start < self.config.interval_ms:
            return None
        overloaded = self._min_lag > self.config.target_ms
        self._interval_start, self._min_lag = now_ms, float("inf")
        if overloaded:
            self.overloaded_intervals += 1
            self.share *= self.config.decrease
            if self.share < self.config.step / 2:
                self.share = 0.0  # nothing decoded until a calm interval
        else:
            self.share = min(1.0, self.share + self.config.step)
        return overloaded

    def admit(self) -> bool:
        """Whether the next sheddable window is decoded (True always while admission is off)."""
        if not self.enabled or self.share >= 1.0:
            return True
        self._credit += self.share
        if self._credit >= 1.0:
            self._credit -= 1.0
            return True
        return False


class LagProbe:
    """Measures the running loop's lag every ``period_s`` and hands it to ``observe``."""

    def __init__(
        self, observe: Callable[[float, float], object], *, period_s: float = 0.05
    ) -> None:
        self._observe = observe
        self._period_s = period_s

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            planned = loop.time() + self._period_s
            await asyncio.sleep(self._period_s)
            now = loop.time()
            self._observe(now * 1000.0, max(0.0, now - planned) * 1000.0)


class VoiceGovernor:
    """The channel's admission shell: the probe feeding a :class:`DecodeAdmission`, and what
    it decided on the metrics."""

    def __init__(self, config: DecodeAdmissionConfig, metrics: Metrics) -> None:
        self.admission = DecodeAdmission(config)
        self._windows = metrics.counter(
            "xiaozhi_lesson_windows",
            "Lesson listen windows by how their audio was taken: decoded; captured undecoded "
            "under voice overload, or unclaimed: the ASR could not take the answer (both "
            "archived, assessment shed)",
            ["mode"],
        )
        self._share = metrics.gauge(
            "xiaozhi_decode_share", "Share of lesson listen windows decoded (1: no overload)"
        )
        self._share.set(1.0)
        self._overloaded = metrics.counter(
            "xiaozhi_overloaded_intervals",
            "Intervals in which the event loop was never idle (every lag probe above target)",
        )

    @property
    def calm(self) -> bool:
        """Every lesson window decoded (no overload now): work that can wait may run."""
        return self.admission.share >= 1.0

    def admit(self, claim: Claim | None = None) -> bool:
        """Whether a lesson window is decoded: the loop admits it, then ``claim`` (the ASR can
        take its answer, :mod:`gateway.assessment.claims`) if there is one."""
        if not self.admission.admit():
            self._windows.labels("captured").inc()
            return False
        if claim is not None and not claim():
            self._windows.labels("unclaimed").inc()
            return False
        self._windows.labels("decoded").inc()
        return True

    def _observe(self, now_ms: float, lag_ms: float) -> None:
        verdict = self.admission.observe(now_ms, lag_ms)
        if verdict is None:
            return
        if verdict:
            self._overloaded.inc()
        self._share.set(self.admission.share)

    async def run(self) -> None:
        if not self.admission.enabled:
            await asyncio.Event().wait()  # nothing to measure
        await LagProbe(self._observe).run()
