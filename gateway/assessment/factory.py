"""Build the configured ASR pool from ``AsrSettings`` (engine: pocketsphinx | http | none)."""

from __future__ import annotations

from gateway.assessment.asr_metrics import AsrMetrics
from gateway.assessment.engine import Backend
from gateway.assessment.http_engine import AsyncBackend, HttpAsrEngine
from gateway.assessment.pool import AsrPool, OnDrop, OnResult
from gateway.assessment.procslot import ProcessBackend
from gateway.assessment.sphinx import PocketsphinxEngine
from gateway.metrics import Metrics
from gateway.settings import AsrSettings


def build_backend(settings: AsrSettings) -> Backend | None:
    """The engine backend, or ``None`` for ``engine = "none"`` (nothing is transcribed)."""
    match settings.engine:
        case "pocketsphinx":
            return ProcessBackend(PocketsphinxEngine, name="pocketsphinx")
        case "http":
            engine = HttpAsrEngine(
                url=settings.http_url,
                model=settings.http_model,
                timeout_s=settings.http_timeout_s,
                retries=settings.http_retries,
            )
            return AsyncBackend(engine)
        case "none":
            return None


def build_pool(
    settings: AsrSettings,
    *,
    metrics: Metrics,
    on_result: OnResult,
    on_drop: OnDrop | None = None,
    backend: Backend | None = None,
    on_withdrawn: OnDrop | None = None,
) -> AsrPool | None:
    """The pool for the service TaskGroup (``run()``), or ``None`` when ASR is off.

    ``backend`` overrides the engine the settings name (tests inject engines this way)."""
    backend = backend or build_backend(settings)
    if backend is None:
        return None
    return AsrPool(
        backend=backend,
        metrics=AsrMetrics(metrics),
        on_result=on_result,
        on_drop=on_drop,
        on_withdrawn=on_withdrawn,
        workers=settings.workers,
        queue_limit=settings.queue_limit,
        job_timeout_s=settings.job_timeout_s,
    )
