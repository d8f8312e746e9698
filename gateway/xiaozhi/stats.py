"""The Xiaozhi channel's figures on the gateway's metrics registry (SPEC §7)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge

from gateway.metrics import Metrics, Quantiles
from gateway.xiaozhi.voice_ports import PipelineCounters


@dataclass
class ChannelStats:
    metrics: Metrics
    sessions_open: Gauge = field(init=False)
    hellos: Counter = field(init=False)
    goodbyes: Counter = field(init=False)
    control_in: Counter = field(init=False)
    control_dropped: Counter = field(init=False)
    udp_packets_in: Counter = field(init=False)
    udp_bytes_in: Counter = field(init=False)
    udp_packets_out: Counter = field(init=False)
    udp_bytes_out: Counter = field(init=False)
    udp_dropped: Counter = field(init=False)
    udp_rebinds: Counter = field(init=False)
    frames_decoded: Counter = field(init=False)
    frames_concealed: Counter = field(init=False)
    frames_skipped: Counter = field(init=False)
    frames_captured: Counter = field(init=False)
    decode_errors: Counter = field(init=False)
    decoder_resets: Counter = field(init=False)
    audio_queue_dropped: Counter = field(init=False)
    speech_segments: Counter = field(init=False)
    ota_requests: Counter = field(init=False)
    mcp_requests: Counter = field(init=False)
    status_cut: Counter = field(init=False)
    hello_handling_ms: Quantiles = field(init=False)

    def __post_init__(self) -> None:
        m = self.metrics
        self.sessions_open = m.gauge("xiaozhi_sessions", "Open Xiaozhi voice sessions")
        self.hellos = m.counter("xiaozhi_hellos", "Hellos accepted (sessions opened)")
        self.goodbyes = m.counter(
            "xiaozhi_goodbyes", "Sessions closed, by side and reason", ["side", "reason"]
        )
        self.control_in = m.counter(
            "xiaozhi_control_messages", "Control messages received, by type", ["type"]
        )
        self.control_dropped = m.counter(
            "xiaozhi_control_dropped", "Control messages refused, by reason", ["reason"]
        )
        self.udp_packets_in = m.counter("xiaozhi_udp_packets_in", "UDP datagrams received")
        self.udp_bytes_in = m.counter("xiaozhi_udp_bytes_in", "UDP bytes received")
        self.udp_packets_out = m.counter("xiaozhi_udp_packets_out", "UDP datagrams sent")
        self.udp_bytes_out = m.counter("xiaozhi_udp_bytes_out", "UDP bytes sent")
        self.udp_dropped = m.counter(
            "xiaozhi_udp_dropped", "UDP datagrams dropped, by reason", ["reason"]
        )
        self.udp_rebinds = m.counter(
            "xiaozhi_udp_rebinds", "Sessions moved to a new source address (NAT rebinding)"
        )
        self.frames_decoded = m.counter("xiaozhi_opus_frames_decoded", "Opus frames decoded")
        self.frames_concealed = m.counter(
            "xiaozhi_opus_frames_concealed", "Lost Opus frames concealed (PLC/FEC, at most 5 a gap)"
        )
        self.decode_errors = m.counter(
            "xiaozhi_opus_decode_errors", "Packets libopus rejected (concealed instead)"
        )
        self.decoder_resets = m.counter(
            "xiaozhi_opus_decoder_resets",
            "Sequence gaps too long to conceal (over 5 frames): decoder reset instead",
        )
        self.frames_skipped = m.counter(
            "xiaozhi_opus_frames_skipped", "Frames not decoded because nobody was listening"
        )
        self.frames_captured = m.counter(
            "xiaozhi_opus_frames_captured",
            "Frames kept undecoded for the archive (a lesson window opened under voice overload)",
        )
        self.audio_queue_dropped = m.counter(
            "xiaozhi_audio_queue_dropped", "Uplink frames dropped on queue overflow (oldest)"
        )
        self.speech_segments = m.counter("xiaozhi_vad_segments", "Utterances cut by the VAD")
        self.ota_requests = m.counter(
            "xiaozhi_ota_requests", "OTA provisioning requests, by HTTP status", ["status"]
        )
        self.mcp_requests = m.counter(
            "xiaozhi_mcp_requests", "MCP requests sent to devices, by outcome", ["outcome"]
        )
        self.status_cut = m.counter(
            "xiaozhi_status_cut",
            "Device status bounds hit: tools not kept, texts shortened, devices evicted",
            ["what"],
        )
        self.hello_handling_ms = m.quantiles(
            "xiaozhi_hello_handling_ms", "Hello receipt to reply enqueued (ms)"
        )

    def pipeline_counters(self) -> PipelineCounters:
        return PipelineCounters(
            frames_decoded=self.frames_decoded.inc,
            frames_concealed=self.frames_concealed.inc,
            frames_skipped=self.frames_skipped.inc,
            queue_dropped=self.audio_queue_dropped.inc,
            decode_errors=self.decode_errors.inc,
            segments=self.speech_segments.inc,
            decoder_resets=self.decoder_resets.inc,
            frames_captured=self.frames_captured.inc,
        )
