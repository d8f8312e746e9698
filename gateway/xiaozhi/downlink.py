"""Downlink audio pacing (reference §7): a small pre-buffer, then real time.

Devices queue at most 40 packets and drop the rest, so a whole utterance must not be burst.
Like the reference server, the first ``prebuffer`` packets go at once and then one packet per
frame duration, on deadlines computed from the start (no drift from sleep jitter). ``tts stop``
goes once the device has had time to play what it holds: the last deadline plus
``prebuffer + 2`` frames.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Pacing:
    frame_ms: int = 60
    prebuffer: int = 5

    def due(self, index: int, start: float) -> float:
        """Monotonic time at which packet ``index`` (0-based) may be sent."""
        if index < 0:
            raise ValueError("index must be >= 0")
        late = max(0, index - self.prebuffer + 1)
        return start + late * self.frame_ms / 1000

    def stop_due(self, count: int, start: float) -> float:
        """When ``tts stop`` may follow ``count`` packets sent from ``start``."""
        last = self.due(count - 1, start) if count else start
        return last + (self.prebuffer + 2) * self.frame_ms / 1000 if count else start

    def timestamp(self, index: int) -> int:
        """Downlink header timestamp (ms of stream time, u32)."""
        return (index * self.frame_ms) & 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class SpeakResult:
    sent: int  # packets that went out
    dropped: int  # packets refused (too large)
