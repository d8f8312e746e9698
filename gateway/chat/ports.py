"""What CHAT is built with: the Xiaozhi channel it speaks through (one per device session) and
the ports every device's CHAT shares (alarms, metrics, clock, task spawner, the voice-session
config, the upstream bridge or the embedded engine).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gateway.chat import voice as v
from gateway.chat.bridge import BridgeContext, Spawn
from gateway.chat.cues import Cues
from gateway.chat.embedded import EmbeddedEngine
from gateway.chat.metrics import ChatMetrics


class VoiceChannel(Protocol):
    """What CHAT uses of the Xiaozhi channel."""

    def publish(self, dev: str, payload: bytes) -> None: ...

    def send_audio(self, dev: str, session_id: str, opus_packet: bytes) -> bool: ...

    def close_session(self, dev: str) -> bool: ...

    def set_listening(self, dev: str, listening: bool) -> None: ...

    def answer_hello(
        self, dev: str, session_id: str, *, sample_rate: int, frame_ms: int
    ) -> bool: ...


@dataclass(frozen=True)
class ChatPorts:
    """What every device's CHAT shares (the channel comes with each device's session)."""

    alarm: Callable[[str, str, str], None]  # alarm, device, reason
    metrics: ChatMetrics
    clock: Callable[[], float]  # monotonic seconds
    spawn: Spawn
    config: v.VoiceConfig
    bridge: BridgeContext | None  # None: the embedded engine answers
    engine: EmbeddedEngine | None
    downlink_capacity: int = 500
    tts_lead_s: float = 0.2  # audio held after ``tts start`` (player.py: the broker hop)
    start_task: Callable[[str], None] | None = None  # the voice task (priority 1), by device
    cues: Cues | None = None  # voice-session cues as Opus frames (None: no cues)
