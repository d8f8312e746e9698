"""Per-session audio pipeline: bounded queue, overflow → concealment, listening switch, stream
time from sequence numbers, real decoder + VAD on real speech."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from codec.opus import DecoderCounters, OpusStreamDecoder
from codec.vad import SpeechStarted, SpeechStopped, VadEvent, VadSegmenter
from gateway.settings import ArchiveSettings
from gateway.xiaozhi.pipeline import AudioPipeline
from gateway.xiaozhi.voice_ports import PipelineCounters, packets_to_keep, utterance_id
from tests.support import speech
from tests.support.opus_stream import encode

FRAME_BYTES = 1920


@dataclass
class Tally:
    values: dict[str, int] = field(default_factory=dict)

    def counters(self) -> PipelineCounters:
        def bump(name: str) -> object:
            return lambda n: self.values.__setitem__(name, self.values.get(name, 0) + n)

        return PipelineCounters(
            frames_decoded=bump("decoded"),  # type: ignore[arg-type]
            frames_concealed=bump("concealed"),  # type: ignore[arg-type]
            frames_skipped=bump("skipped"),  # type: ignore[arg-type]
            queue_dropped=bump("dropped"),  # type: ignore[arg-type]
            segments=bump("segments"),  # type: ignore[arg-type]
            decode_errors=bump("errors"),  # type: ignore[arg-type]
            decoder_resets=bump("resets"),  # type: ignore[arg-type]
            frames_captured=bump("captured"),  # type: ignore[arg-type]
        )


class FakeDecoder:
    """Counts like codec's decoder: a packet ``b"bad"`` is rejected (concealed instead)."""

    def __init__(self) -> None:
        self.calls: list[tuple[bytes, int]] = []
        self.counters = DecoderCounters()

    def decode(self, packet: bytes, lost_before: int = 0) -> bytes:
        self.calls.append((packet, lost_before))
        self.counters.concealed += lost_before
        if packet == b"bad":
            self.counters.decode_errors += 1
            self.counters.concealed += 1
        else:
            self.counters.frames_decoded += 1
        return bytes(FRAME_BYTES * (lost_before + 1))


class ScriptedSegmenter:
    """Emits a start at 0 ms of the first push and a stop after the third push."""

    def __init__(self) -> None:
        self.pushed = 0

    def push(self, pcm: bytes) -> list[VadEvent]:
        self.pushed += len(pcm) // FRAME_BYTES
        if self.pushed == 1:
            return [SpeechStarted(at_ms=0)]
        if self.pushed == 3:
            return [
                SpeechStopped(
                    at_ms=180, pcm=b"u" * 10, duration_ms=180, truncated=False, started_ms=0
                )
            ]
        return []

    def flush(self) -> list[VadEvent]:
        return [SpeechStopped(at_ms=99, pcm=b"f", duration_ms=99, truncated=False, started_ms=0)]


class PipelineSink:
    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []
        self.packets: list[tuple[bytes, ...]] = []

    def speech_started(self, dev: str, session_id: str, at_ms: float) -> None:
        self.events.append(("start", dev, session_id, at_ms))

    def speech_stopped(
        self,
        dev: str,
        session_id: str,
        pcm: bytes,
        start_ms: float,
        end_ms: float,
        *,
        packets: Sequence[bytes] = (),
    ) -> None:
        self.events.append(("stop", dev, session_id, start_ms, end_ms, len(pcm)))
        self.packets.append(tuple(packets))


def pipeline(**kwargs: object) -> tuple[AudioPipeline, FakeDecoder, PipelineSink, Tally]:
    decoder, sink, tally = FakeDecoder(), PipelineSink(), Tally()
    defaults: dict[str, object] = {
        "dev": "d",
        "session_id": "s",
        "sink": sink,
        "decoder": decoder,
        "new_segmenter": ScriptedSegmenter,
        "counters": tally.counters(),
    }
    defaults.update(kwargs)
    return AudioPipeline(**defaults), decoder, sink, tally  # type: ignore[arg-type]


def test_stream_time_comes_from_sequence_numbers() -> None:
    p, _, sink, tally = pipeline()
    for seq in (11, 12, 13):  # the segmenter starts at frame 11 → 600 ms of session time
        p.receive(b"x", seq, 0)
    assert p.drain() == 3
    assert sink.events == [("start", "d", "s", 600.0), ("stop", "d", "s", 600.0, 780.0, 10)]
    assert tally.values == {"decoded": 3, "segments": 1}


@pytest.mark.parametrize(
    ("kept", "expected"), [(0, ()), (2, (b"\x0c", b"\x0d")), (10, (b"\x0b", b"\x0c", b"\x0d"))]
)
def test_an_utterance_carries_its_own_opus_packets(kept: int, expected: tuple[bytes]) -> None:
    p, _, sink, _ = pipeline(packets_kept=kept)
    for seq in (9, 11, 12, 13):  # frame 9 is before the utterance (600-780 ms): not in it
        p.receive(bytes([seq]), seq, 0)
        if seq == 9:
            p.drain()
            p.set_listening(False)  # the segmenter restarts at frame 11
            p.set_listening(True)
    p.drain()
    assert sink.events[-1] == ("stop", "d", "s", 600.0, 780.0, 10)
    assert sink.packets[-1] == expected


def test_packets_to_keep_follows_the_archive_settings() -> None:
    assert packets_to_keep(ArchiveSettings(max_utterance_s=15)) == 252
    assert packets_to_keep(ArchiveSettings(enabled=False)) == 0


def test_overflow_drops_oldest_and_conceals_the_gap() -> None:
    p, decoder, _, tally = pipeline(capacity=3)
    for seq in range(1, 7):
        p.receive(bytes([seq]), seq, 0)
    assert p.queued == 3
    assert tally.values["dropped"] == 3
    p.drain()
    assert decoder.calls == [(b"\x04", 3), (b"\x05", 0), (b"\x06", 0)]
    assert tally.values["concealed"] == 3


def test_rejected_packets_count_as_errors_and_concealment() -> None:
    p, _, _, tally = pipeline()
    p.receive(b"ok", 1, 0)
    p.receive(b"bad", 2, 0)
    p.receive(b"ok", 5, 2)
    p.drain()
    assert tally.values == {"decoded": 2, "concealed": 3, "errors": 1}


def test_not_listening_skips_decoding_and_restarts_segmenter() -> None:
    p, decoder, sink, tally = pipeline(listening=False)
    p.receive(b"a", 1, 0)
    p.drain()
    assert decoder.calls == []
    assert tally.values == {"skipped": 1}
    p.set_listening(True)
    p.receive(b"b", 5, 2)  # two frames lost before seq 5: the stretch starts at seq 3
    p.drain()
    assert decoder.calls == [(b"b", 2)]
    # 3 frames of PCM (2 concealed + 1) in one push; the stretch's time base is seq 3 → 120 ms.
    assert sink.events == [("stop", "d", "s", 120.0, 300.0, 10)]


def test_finish_processes_the_queue_and_closes_the_open_utterance() -> None:
    p, decoder, sink, _ = pipeline()
    p.receive(b"x", 1, 0)
    p.receive(b"y", 2, 0)
    p.finish()
    assert len(decoder.calls) == 2
    assert p.queued == 0
    assert sink.events[-1] == ("stop", "d", "s", 0.0, 99.0, 1)
    p.finish()  # idempotent: nothing queued, no segmenter
    assert len(sink.events) == 2


def test_listening_off_flushes_the_open_utterance_to_the_sink() -> None:
    p, decoder, sink, _ = pipeline()
    p.receive(b"x", 1, 0)
    p.drain()
    p.receive(b"y", 2, 0)  # queued, not yet processed
    p.set_listening(False)
    assert len(decoder.calls) == 2
    assert sink.events == [("start", "d", "s", 0.0), ("stop", "d", "s", 0.0, 99.0, 1)]
    p.set_listening(False)  # no change, nothing more
    assert len(sink.events) == 2
    assert utterance_id("s", 0.0) == utterance_id("s", 0.4) == "s:0"


def test_a_capture_only_stretch_keeps_packets_undecoded_and_hands_them_over_once() -> None:
    notified: list[AudioPipeline] = []
    p, decoder, sink, tally = pipeline(packets_kept=3, listening=False, notify=notified.append)
    p.set_listening(True, decode=False)
    for seq in range(1, 6):  # five frames, three kept (the archive's longest answer)
        p.receive(bytes([seq]), seq, 0)
    assert (p.queued, decoder.calls, notified, sink.events) == (0, [], [], [])
    assert p.take_captured() is None  # still capturing: nothing to take yet
    p.set_listening(False)
    assert p.take_captured() == (b"\x01", b"\x02", b"\x03")
    assert p.take_captured() is None  # once
    assert tally.values == {"captured": 5}
    p.receive(b"late", 6, 0)  # nobody listens: skipped, not captured
    assert tally.values == {"captured": 5, "skipped": 1}


def test_capture_packets_left_untaken_are_dropped_when_a_new_stretch_starts() -> None:
    p, _, _, _ = pipeline(packets_kept=3, listening=False)
    p.set_listening(True, decode=False)
    p.receive(b"a", 1, 0)
    p.set_listening(False)
    p.set_listening(True)  # a decoded stretch: the old capture is stale
    p.set_listening(False)
    assert p.take_captured() is None


def test_switching_between_decoding_and_capture_while_listening() -> None:
    p, decoder, sink, _ = pipeline(packets_kept=3)
    p.receive(b"x", 1, 0)
    p.set_listening(True, decode=False)  # decoding → capture: the queued frame is decoded first
    assert [c[0] for c in decoder.calls] == [b"x"]
    assert sink.events[-1][0] == "stop"  # and the open utterance closed
    p.set_listening(True, decode=False)  # no change
    p.receive(b"c", 2, 0)
    p.set_listening(True)  # capture → decoding: what was captured waits to be taken
    p.receive(b"d", 3, 0)
    assert p.queued == 1
    assert p.take_captured() == (b"c",)
    p.set_listening(True)  # no change: nothing flushed
    assert p.queued == 1


def test_sink_failure_is_contained() -> None:
    class BrokenSink(PipelineSink):
        def speech_started(self, dev: str, session_id: str, at_ms: float) -> None:
            raise RuntimeError("runtime bug")

    p, _, _, tally = pipeline(sink=BrokenSink())
    for seq in (1, 2, 3):
        p.receive(b"x", seq, 0)
    assert p.drain() == 3
    assert tally.values["segments"] == 1


async def test_run_processes_in_batches_and_yields() -> None:
    p, decoder, _, _ = pipeline(batch=2)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(p.run(), name="test.pipeline")
        for seq in range(1, 6):
            p.receive(b"x", seq, 0)
        seen = []
        for _ in range(3):
            await asyncio.sleep(0)  # one turn of the task: at most one batch, then it yields
            seen.append(len(decoder.calls))
        assert seen == [2, 4, 5]
        task.cancel()
    assert len(decoder.calls) == 5


async def test_with_a_pump_the_pipeline_notifies_it_and_has_no_task_of_its_own() -> None:
    notified: list[AudioPipeline] = []
    p, _, _, _ = pipeline(notify=notified.append)
    p.receive(b"x", 1, 0)
    assert notified == [p]
    with pytest.raises(RuntimeError, match="AudioPump"):
        await p.run()


@pytest.mark.integration
def test_real_decoder_and_vad_find_real_utterances() -> None:
    timeline = speech.compose([600, "Good morning.", 900, "How are you today?", 900])
    packets = encode(timeline.pcm)
    p, _, sink, _ = pipeline(decoder=OpusStreamDecoder(), new_segmenter=VadSegmenter)
    for seq, packet in enumerate(packets, start=1):
        p.receive(packet, seq, 0)
        p.drain()
    stops = [e for e in sink.events if e[0] == "stop"]
    assert len(stops) == len(timeline.utterances)
    for event, utt in zip(stops, timeline.utterances, strict=True):
        assert abs(float(event[3]) - utt.start_ms) <= 150  # type: ignore[arg-type]
        assert abs(float(event[4]) - utt.end_ms) <= 150  # type: ignore[arg-type]
