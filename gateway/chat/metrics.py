"""CHAT's counters (Prometheus via the service's registry; ``snlpgw_chat_*``)."""

from __future__ import annotations

from gateway.chat.voice import UplinkVerdict
from gateway.metrics import Metrics

_NOT_COUNTED = (
    UplinkVerdict.RELAY,
    UplinkVerdict.SUSPENDED,
)  # a turn's frames (frames_up), a task's


class ChatMetrics:
    def __init__(self, metrics: Metrics) -> None:
        self.sessions = metrics.gauge("chat_devices", "Devices with CHAT state")
        self.turns = metrics.counter("chat_turns", "CHAT turns begun")
        self.standby = metrics.counter(
            "chat_standby", "Devices sent to standby, by reason", ["reason"]
        )
        self.upstream = metrics.counter(
            "chat_upstream_ends", "Upstream links ended or refused, by reason", ["reason"]
        )
        self.hellos = metrics.counter(
            "chat_hellos_answered",
            "Device hellos answered after the upstream's hello, by announced sample rate",
            ["sample_rate"],
        )
        self.frames_up = metrics.counter("chat_frames_up", "Uplink Opus frames bridged upstream")
        outside = metrics.counter(
            "chat_uplink_outside_turn",
            "Uplink frames outside a listening turn, by reason: wake_word (relayed before the "
            "device's listen), before_listen, greeting, thinking, speaking, closed (dropped)",
            ["reason"],
        )
        # One child per reason, made here: the per-frame path only looks it up.
        self.uplink_outside = {
            u: outside.labels(u.value) for u in UplinkVerdict if u not in _NOT_COUNTED
        }
        self.cues = metrics.counter("chat_cues", "Voice-session cues sent, by kind", ["kind"])
        self.frames_down = metrics.counter("chat_frames_down", "Downlink TTS frames sent")
        self.control_down = metrics.counter(
            "chat_control_down", "Upstream control messages relayed down", ["type"]
        )
        self.dropped = metrics.counter("chat_dropped", "CHAT frames/messages dropped", ["reason"])
        self.failed = metrics.counter(
            "chat_callback_failures",
            "CHAT timer firings and downlink items whose handling raised (logged; the device "
            "goes on)",
        )
