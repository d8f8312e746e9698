"""What the uplink audio pipeline (:mod:`pipeline`) works with: its decoder and VAD segmenter,
the :class:`VoiceSink` its utterances go to, its counters, and the archive's share of it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from codec.opus import DecoderCounters
from codec.vad import VadEvent

FRAME_MS = 60

# Asked as a lesson window opens that the loop admitted: can the ASR take its answer? (the task
# runtime's claim on gateway.assessment.claims; False: the window is captured, not decoded)
Claim = Callable[[], bool]


class Segmenter(Protocol):
    """codec's ``VadSegmenter`` (one per listening stretch; times relative to its first sample)."""

    def push(self, pcm: bytes) -> list[VadEvent]: ...

    def flush(self) -> list[VadEvent]: ...


class ArchiveOptions(Protocol):
    """What :func:`packets_to_keep` reads of the ``archive`` settings."""

    @property
    def enabled(self) -> bool: ...

    @property
    def max_utterance_s(self) -> float: ...


def packets_to_keep(archive: ArchiveOptions) -> int:
    """Opus packets a session keeps for the archive: its longest utterance and a frame either
    side (0 when the archive is off: nothing kept)."""
    return int(archive.max_utterance_s * 1000 / FRAME_MS) + 2 if archive.enabled else 0


def utterance_id(session_id: str, start_ms: float) -> str:
    """A stable id for one utterance: the same for its start and stop callbacks."""
    return f"{session_id}:{int(start_ms)}"


class Decoder(Protocol):
    """codec's ``OpusStreamDecoder``: PCM for the lost frames then the packet; its running
    ``counters`` (decoded, concealed incl. rejected packets, decode errors) feed the metrics."""

    counters: DecoderCounters

    def decode(self, packet: bytes, lost_before: int = 0) -> bytes: ...


class VoiceSink(Protocol):
    """What the runtime receives from a device's microphone (times are session stream ms).
    ``packets``: the device's own Opus packets covering the utterance (the learning record's
    archive keeps them; empty when the pipeline keeps none)."""

    def speech_started(self, dev: str, session_id: str, at_ms: float) -> None: ...

    def speech_stopped(
        self,
        dev: str,
        session_id: str,
        pcm: bytes,
        start_ms: float,
        end_ms: float,
        *,
        packets: Sequence[bytes] = (),
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class PipelineCounters:
    """Callbacks into the channel's metrics (kept as plain callables so tests need no registry)."""

    frames_decoded: Callable[[int], None]
    frames_concealed: Callable[[int], None]
    frames_skipped: Callable[[int], None]
    queue_dropped: Callable[[int], None]
    decode_errors: Callable[[int], None]
    segments: Callable[[int], None]
    decoder_resets: Callable[[int], None]
    frames_captured: Callable[[int], None]  # kept undecoded (a capture-only window)
