"""Re-assessment: ASR and metrics re-run on archived answers with any engine (``snlpgw
reassess``), each result stored as a new row keyed by (step, engine, engine version) beside the
step's original assessment (``gateway/store/assessments.py``).

Idempotent: a step that already has a row for this engine version is skipped (not re-run); a
step whose ASR failed gets no row and is tried again next time. The archived Ogg Opus is the
device's own packets: demuxed and decoded by the gateway's libopus decoder to 16 kHz PCM, then
transcribed exactly as a live answer (the instance's reference sentences as hints).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import logging
import time
from dataclasses import dataclass

from codec.opus import OpusStreamDecoder
from gateway.archive import AudioBlobs, BlobMissing, demux_ogg_opus
from gateway.assessment.assessor import DEFAULT_METHODS, assess
from gateway.assessment.engine import Backend, Slot
from gateway.assessment.jobs import AsrFailure, AsrJob, AsrKey, AsrResult
from gateway.settings import AsrSettings
from gateway.store import Store, StoredMetric
from gateway.store.assessments import (
    ArchivedStep,
    StepAssessment,
    add_assessments,
    archived_steps,
    assessed_keys,
)

log = logging.getLogger(__name__)
MAX_STEPS = 100_000  # one run's selection, whatever the range


@dataclass(frozen=True, slots=True)
class ReassessSelection:
    """Which archived answers: one instance, one device, and/or creation time range (ms)."""

    instance_id: str | None = None
    device: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None

    def __post_init__(self) -> None:
        if self.instance_id is None and self.device is None and self.since_ms is None:
            raise ValueError("reassess needs an instance, a device or a date range")


@dataclass(frozen=True, slots=True)
class EngineIdentity:
    engine: str
    version: str


@dataclass(slots=True)
class ReassessReport:
    selected: int = 0  # archived answers in the selection
    assessed: int = 0  # new rows written
    already: int = 0  # rows of this engine version found: skipped
    missing_audio: int = 0  # the blob is gone (retention, forget)
    failed: int = 0  # ASR failed or the audio could not be decoded: no row, tried next time


def engine_identity(settings: AsrSettings) -> EngineIdentity:
    """The engine and version a row is keyed by: the package version for the embedded engine
    (with its lesson language model), the model name for an HTTP service."""
    if settings.engine == "http":
        return EngineIdentity("http", settings.http_model)
    try:
        version = importlib.metadata.version("pocketsphinx")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return EngineIdentity(settings.engine, f"{version}+lesson-lm")


def decode_answer(ogg: bytes) -> bytes:
    """16 kHz s16le mono PCM of an archived answer (ValueError if it is not Ogg Opus)."""
    content = demux_ogg_opus(ogg)
    decoder = OpusStreamDecoder(sample_rate=16_000)
    try:
        return b"".join(decoder.decode(packet) for packet in content.packets)
    finally:
        decoder.close()


async def reassess(
    *,
    store: Store,
    blobs: AudioBlobs,
    backend: Backend,
    identity: EngineIdentity,
    selection: ReassessSelection,
    methods: tuple[str, ...] = DEFAULT_METHODS,
    job_timeout_s: float = 60.0,
) -> ReassessReport:
    report = ReassessReport()
    steps = await store.call(
        lambda db: archived_steps(
            db,
            instance_id=selection.instance_id,
            device=selection.device,
            since_ms=selection.since_ms,
            until_ms=selection.until_ms,
            limit=MAX_STEPS,
        )
    )
    done = await store.call(lambda db: assessed_keys(db, identity.engine, identity.version))
    report.selected = len(steps)
    slot: Slot | None = None
    try:
        for step in steps:
            if (step.instance_id, step.step_index) in done:
                report.already += 1
                continue
            if slot is None or not slot.healthy:
                if slot is not None:
                    slot.close()
                slot = await backend.open_slot()
            row = await _one(
                step,
                blobs,
                slot=slot,
                identity=identity,
                methods=methods,
                timeout_s=job_timeout_s,
                report=report,
            )
            if row is not None:
                await store.call(functools.partial(add_assessments, rows=[row]))
                report.assessed += 1
    finally:
        if slot is not None:
            slot.close()
        await backend.aclose()
    return report


async def _one(
    step: ArchivedStep,
    blobs: AudioBlobs,
    *,
    slot: Slot,
    identity: EngineIdentity,
    methods: tuple[str, ...],
    timeout_s: float,
    report: ReassessReport,
) -> StepAssessment | None:
    try:
        ogg = await asyncio.to_thread(blobs.get, step.audio_id)
    except BlobMissing:
        report.missing_audio += 1
        return None
    try:
        pcm = await asyncio.to_thread(decode_answer, ogg)
    except ValueError as exc:
        log.warning("reassess: %s step %d: %s", step.instance_id, step.step_index, exc)
        report.failed += 1
        return None
    key = AsrKey(step.instance_id, step.step_index, step.audio_id)
    result: AsrResult | AsrFailure = await slot.run(AsrJob(key, pcm, step.hints), timeout_s)
    if isinstance(result, AsrFailure):
        log.warning(
            "reassess: ASR failed for %s step %d: %s",
            step.instance_id,
            step.step_index,
            result.reason,
        )
        report.failed += 1
        return None
    metrics = assess(step.expected_text, result.text, methods)
    return StepAssessment(
        instance_id=step.instance_id,
        step_index=step.step_index,
        engine=identity.engine,
        engine_version=identity.version,
        asr_text=result.text or None,
        metrics=tuple(StoredMetric(m.method, m.value) for m in metrics),
        audio_id=step.audio_id,
        assessed_ms=time.time_ns() // 1_000_000,
    )
