"""Start admission (pure): a herd of lesson starts is spread out, so the steps that follow fit.

A lesson's steps keep the phase its start gave them: 1,000 lessons started in the same few
hundred milliseconds close their listen windows in the same few hundred milliseconds at every
step, each close costing the gateway its commands, events and rows, and the clip after a late
close is late for the child. Spreading the starts once spreads every step after them
(``bench/results/load/admission.md``: the same 1,000 starts spread over one second read a
next-clip p99 of 10.7-13.5 ms against 23-163 ms started at once).

:class:`StartPacer` is the generic cell rate algorithm (a token bucket kept in one number, the
theoretical arrival time): each start reserves a slot ``1 / rate`` after the previous one;
after a quiet spell up to ``burst`` go at once; a start whose slot would lie more than
``max_wait_ms`` ahead is refused (the gateway answers ``overloaded``) and reserves nothing.
Time is an input (monotonic milliseconds).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """How fast lesson starts are admitted (``runtime.start_*`` settings)."""

    rate_per_s: float = 500.0
    burst: int = 20
    max_wait_ms: float = 5_000.0

    def __post_init__(self) -> None:
        if self.rate_per_s <= 0 or self.burst < 1 or self.max_wait_ms < 0:
            raise ValueError("admission needs rate_per_s > 0, burst >= 1, max_wait_ms >= 0")


class StartPacer:
    def __init__(self, config: AdmissionConfig) -> None:
        self._interval = 1000.0 / config.rate_per_s
        self._tolerance = (config.burst - 1) * self._interval
        self._max_wait = config.max_wait_ms
        self._tat: float | None = None  # when the bucket is next empty; None: never used

    def reserve(self, now_ms: float) -> float | None:
        """The time the start asked for at ``now_ms`` may go (``now_ms`` itself when a slot
        is free), or ``None``: it would wait longer than ``max_wait_ms`` (nothing reserved)."""
        tat = now_ms if self._tat is None else max(self._tat, now_ms)
        slot = max(now_ms, tat - self._tolerance)
        if slot - now_ms > self._max_wait:
            return None
        self._tat = tat + self._interval
        return slot
