"""SPEAK's metrics (``snlpgw_speech_*``); every label value comes from a fixed set."""

from __future__ import annotations

from gateway.metrics import Metrics

KINDS = ("speak", "clip")
OUTCOMES = ("completed", "interrupted")
# Interruption reasons and synthesis failures are the service's own constants (never a
# device's or a caller's string); anything else is counted as "other".
REASONS = frozenset(
    {
        "cancelled",
        "replaced",
        "session_closed",
        "no_session",
        "device_unreachable",
        "unknown_voice",
        "too_long",
        "busy",
        "not_running",
        "synthesis_failed",
        "service_stopped",
    }
)
FAILURES = frozenset(
    {
        "espeak-ng_failed",
        "sox_failed",
        "clip_missing",
        "http_status",
        "http_timeout",
        "http_error",
        "http_empty",
        "http_too_large",
        "encode_failed",
    }
)


def bounded(value: str, allowed: frozenset[str]) -> str:
    return value if value in allowed else "other"


class SpeechMetrics:
    def __init__(self, metrics: Metrics) -> None:
        self.requests = metrics.counter("speech_requests", "Speak/clip requests", ["kind"])
        self.completed = metrics.counter(
            "speech_completed", "Utterances played to the end", ["kind"]
        )
        self.interrupted = metrics.counter(
            "speech_interrupted", "Utterances interrupted or refused, by reason", ["reason"]
        )
        self.failures = metrics.counter(
            "speech_synthesis_failures", "Syntheses/clip decodes that failed", ["reason"]
        )
        self.frames_down = metrics.counter("speech_frames_down", "Opus frames sent down")
        self.dropped = metrics.counter(
            "speech_dropped", "Downlink frames/messages dropped, by reason", ["reason"]
        )
        self.cache_hits = metrics.counter("speech_cache_hits", "Phrase cache hits")
        self.cache_misses = metrics.counter("speech_cache_misses", "Phrase cache misses")
        self.cache_bytes = metrics.gauge("speech_cache_bytes", "Phrase cache size (Opus bytes)")
        self.prepared = metrics.gauge(
            "speech_prepared_phrases",
            "Phrases in the cache ahead of use after the last preparation (start, catalog reload)",
        )
        self.prepare_s = metrics.gauge(
            "speech_prepare_seconds", "How long the last phrase preparation took"
        )
        self.speaking = metrics.gauge("speech_devices", "Devices with speech in progress")
        self.synth_ms = metrics.histogram(
            "speech_synthesis_ms",
            "Synthesis + encoding time (cache misses)",
            ["engine"],
            buckets=(10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000),
        )
