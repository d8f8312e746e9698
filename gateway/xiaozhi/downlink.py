"""Downlink audio pacing (reference §7): a small pre-buffer, then real time.

Devices queue at most 40 packets and drop the rest, so a whole utterance must not be burst.
Like the reference server, the first ``prebuffer`` packets go at once and then one packet per
frame duration, on deadlines computed from the start (no drift from sleep jitter). ``tts stop``
goes once the device has had time to play what it holds: the last deadline plus
``prebuffer + 2`` frames.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
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


@dataclass(frozen=True, slots=True)
class SpeakResult:
    sent: int  # packets that went out
    dropped: int  # packets refused (too large)


class SpeakInterrupted(Exception):
    """The session ended while its audio was being sent."""


async def send_paced(
    packets: Iterable[bytes],
    *,
    pacing: Pacing,
    clock: Callable[[], float],
    send: Callable[[bytes], bool],
    still_open: Callable[[], bool],
) -> SpeakResult:
    """Send ``packets`` on the pacing deadlines, then wait until ``tts stop`` may follow.

    ``send(packet)`` returns False for a refused packet (counted by the caller);
    ``still_open()`` is checked before every packet (raises :class:`SpeakInterrupted`).
    """
    start = clock()
    sent = dropped = 0
    for index, packet in enumerate(packets):
        delay = pacing.due(index, start) - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        if not still_open():
            raise SpeakInterrupted
        if send(packet):
            sent += 1
        else:
            dropped += 1
    delay = pacing.stop_due(sent + dropped, start) - clock()
    if delay > 0:
        await asyncio.sleep(delay)
    return SpeakResult(sent=sent, dropped=dropped)
