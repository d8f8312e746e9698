"""The ASR figures on the gateway's metrics registry (SPEC §7: queue depth, latency, failures)."""

from __future__ import annotations

from gateway.assessment.jobs import AsrFailure, AsrOutcome, AsrResult
from gateway.metrics import Metrics


class AsrMetrics:
    def __init__(self, metrics: Metrics) -> None:
        self.queued = metrics.counter("asr_jobs_queued", "ASR jobs accepted by the pool")
        self.done = metrics.counter("asr_jobs_done", "ASR jobs that produced a transcript")
        self.failed = metrics.counter(
            "asr_jobs_failed", "ASR jobs that ended in a typed failure", ["reason"]
        )
        self.timed_out = metrics.counter(
            "asr_jobs_timed_out", "ASR jobs abandoned at the job timeout"
        )
        self.dropped = metrics.counter(
            "asr_jobs_dropped", "ASR jobs dropped before running", ["reason"]
        )
        self.depth = metrics.gauge("asr_queue_depth", "ASR jobs waiting for a worker")
        self.restarts = metrics.counter(
            "asr_worker_restarts", "ASR workers replaced after a crash, hang or failed start"
        )
        self.latency_ms = metrics.quantiles("asr_latency_ms", "ASR submit-to-result time (ms)")
        self.rtf = metrics.quantiles(
            "asr_real_time_factor", "ASR engine time divided by audio duration"
        )

    def outcome(self, outcome: AsrOutcome) -> None:
        self.latency_ms.observe(outcome.latency_ms)
        match outcome.result:
            case AsrResult(audio_ms=audio, elapsed_ms=elapsed):
                self.done.inc()
                if audio > 0:
                    self.rtf.observe(elapsed / audio)
            case AsrFailure(reason=reason):
                self.failed.labels(reason.value).inc()
                if reason == "timeout":
                    self.timed_out.inc()
