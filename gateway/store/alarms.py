"""A rate-limited ops alarm: every occurrence is counted by the caller, at most one alarm per
``interval_s`` is raised (a dead disk or manager must not flood the ops topic)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class AlarmFn(Protocol):
    """``Ops.alarm``'s shape."""

    def __call__(self, alarm: str, *, device: str | None = None, **detail: object) -> None: ...


def no_alarm(alarm: str, *, device: str | None = None, **detail: object) -> None:
    """For a store used outside a service (tests, tools): alarms go nowhere."""


class RateLimitedAlarm:
    def __init__(
        self,
        name: str,
        alarm: AlarmFn,
        *,
        interval_s: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._alarm = alarm
        self._interval_s = interval_s
        self._monotonic = monotonic
        self._last: float | None = None
        self.suppressed = 0

    def __call__(self, *, device: str | None = None, **detail: object) -> bool:
        """Raise the alarm unless one was raised within the interval; True if raised."""
        now = self._monotonic()
        if self._last is not None and now - self._last < self._interval_s:
            self.suppressed += 1
            return False
        self._last = now
        self._alarm(self.name, device=device, suppressed=self.suppressed, **detail)
        self.suppressed = 0
        return True
