"""The runtime's small pure rules: listen-window formula, watchdog, priorities, exit phrases.

Every number the hot path steps on is computed here, in one place (SPEC §5).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.settings import RuntimeSettings

LISTEN_RATIO_MIN = 1.2
LISTEN_RATIO_MAX = 1.5
DEFAULT_MIN_WINDOW_MS = 800


class PriorityLevel(IntEnum):
    """Who asked for a task (SPEC §5): higher or equal preempts, lower is refused ``busy``."""

    VOICE = 1
    SCHEDULED = 2
    PARENT = 3


def clamp_ratio(ratio: float) -> float:
    """``listen_ratio`` clamped into [1.2, 1.5]."""
    return min(max(ratio, LISTEN_RATIO_MIN), LISTEN_RATIO_MAX)


SPEED_MIN, SPEED_MAX = 0.5, 2.0  # PLAY_MEDIA speed (device-capability spec D1: clamped)


def clamp_speed(speed: float) -> float:
    """A playback speed into [0.5, 2.0] (out-of-range values are clamped, never refused)."""
    return min(SPEED_MAX, max(SPEED_MIN, speed))


def loops_left(loops: int, played_ms: float, loop_ms: float | None) -> int:
    """Loops a replay must still play after ``played_ms`` of a ``loops``-times play (D14);
    one loop's length unknown: all of them. Never fewer than one (the one playing)."""
    if loop_ms is None or loop_ms <= 0:
        return loops
    return max(1, loops - int(played_ms // loop_ms))


def listen_window_ms(duration_ms: float, ratio: float, min_window_ms: float) -> float:
    """``T = max(min_window_ms, clamp(ratio, 1.2, 1.5) * duration_ms)``; negative durations count as 0."""
    return max(float(min_window_ms), clamp_ratio(ratio) * max(0.0, float(duration_ms)))


def preempts(requested: int, running: int) -> bool:
    """A request with priority ≥ the running instance's preempts it."""
    return requested >= running


def normalise(text: str) -> str:
    """Lower-case; drop punctuation, symbols and whitespace (works for Chinese and English)."""
    return "".join(
        ch
        for ch in unicodedata.normalize("NFKC", text).casefold()
        if unicodedata.category(ch)[0] not in ("P", "S", "Z", "C")
    )


def contains_exit_phrase(text: str, phrases: tuple[str, ...]) -> bool:
    """Normalised containment: some non-empty normalised phrase occurs in the normalised text."""
    said = normalise(text)
    return any(p and p in said for p in (normalise(x) for x in phrases))


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """The numbers a :class:`~gateway.tasks.core.device.DeviceRuntime` needs (all milliseconds)."""

    min_window_ms: int = DEFAULT_MIN_WINDOW_MS
    completion_grace_ms: int = 5_000
    completion_max_ms: int = 120_000
    offline_grace_ms: float = 300_000.0
    exit_phrases: tuple[str, ...] = ("stop the lesson", "退出")

    @classmethod
    def from_settings(cls, settings: RuntimeSettings) -> RuntimeConfig:
        return cls(
            min_window_ms=settings.min_window_ms,
            completion_grace_ms=settings.completion_grace_ms,
            completion_max_ms=settings.completion_max_ms,
            offline_grace_ms=settings.offline_grace_s * 1000.0,
            exit_phrases=tuple(settings.exit_phrases),
        )

    def watchdog_ms(self, duration_ms: float | None, repeat: int = 1) -> float:
        """How long to wait for ``audio.completed``: known duration * repeat + grace, else the max."""
        if duration_ms is None or duration_ms <= 0:
            return float(self.completion_max_ms)
        return float(duration_ms) * max(1, repeat) + self.completion_grace_ms
