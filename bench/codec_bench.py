"""Per-frame cost of the uplink audio path: decrypt, decode, VAD, together, vs. bare libopus.

Run from the repo root: ``python -m bench.codec_bench``. Writes bench/results/codec.json and
bench/results/codec.md. Input: real speech (espeak-ng sentences with pauses), encoded by libopus
at 16 kHz / 60 ms / VOIP and sealed into Xiaozhi UDP datagrams. Every stage runs over the same
frames in one process, passes interleaved. Each pass gives a mean per frame; the headline is the
best (minimum) pass of each stage, the usual noise-robust estimate on a shared machine (other
processes only ever add time), and the median is reported beside it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import statistics
import time
from collections.abc import Callable

import opuslib

from bench.stats import record
from codec.opus import OpusStreamDecoder
from codec.udp import Accepted, UplinkReceiver
from codec.vad import VadSegmenter
from tests.support.opus_stream import datagrams, encode
from tests.support.speech import compose

REPEATS = 40
KEY = bytes.fromhex("00112233445566778899aabbccddeeff")
SSRC = 0xC0DEC0DE
SCRIPT: list[str | int] = [
    500, "Good morning.", 800, "How are you today?", 600,
    "I like to read books with my friends.", 1200, "The cat is sleeping on the chair.", 700,
    "Thank you very much.", 900, "Can you open the window, please?", 600, "What time is it?", 800,
]  # fmt: skip


def direct_libopus() -> Callable[[list[bytes]], None]:
    """opus_decode called through plain ctypes into one preallocated buffer; nothing else."""
    lib = ctypes.CDLL(ctypes.util.find_library("opus") or "libopus.so.0")
    lib.opus_decoder_create.restype = ctypes.c_void_p
    lib.opus_decoder_create.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int))
    lib.opus_decode.restype = ctypes.c_int
    lib.opus_decode.argtypes = (
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int32,
        ctypes.POINTER(ctypes.c_int16),
        ctypes.c_int,
        ctypes.c_int,
    )
    err = ctypes.c_int()
    state = lib.opus_decoder_create(16000, 1, ctypes.byref(err))
    buf = (ctypes.c_int16 * 1920)()
    decode = lib.opus_decode

    def run(packets: list[bytes]) -> None:
        for p in packets:
            decode(state, p, len(p), buf, 1920, 0)

    return run


def libopus_version() -> str:
    lib = ctypes.CDLL(ctypes.util.find_library("opus") or "libopus.so.0")
    lib.opus_get_version_string.restype = ctypes.c_char_p
    return str(lib.opus_get_version_string().decode())


def timed(fn: Callable[[], object], frames: int) -> float:
    start = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - start) / frames / 1000


def main() -> None:
    timeline = compose(SCRIPT)
    packets = encode(timeline.pcm)
    wire = datagrams(packets, key=KEY, ssrc=SSRC)
    pcm_frames = [OpusStreamDecoder().decode(p) for p in packets]
    n = len(packets)
    direct = direct_libopus()

    def decrypt() -> None:
        receiver = UplinkReceiver(key=KEY, ssrc=SSRC)
        for d in wire:
            receiver.accept(d)

    def decode() -> None:
        decoder = OpusStreamDecoder()
        for p in packets:
            decoder.decode(p)

    def opuslib_decode() -> None:
        decoder = opuslib.Decoder(16000, 1)
        for p in packets:
            decoder.decode(p, 960)

    def vad() -> None:
        segmenter = VadSegmenter()
        for f in pcm_frames:
            segmenter.push(f)

    def combined() -> None:
        receiver = UplinkReceiver(key=KEY, ssrc=SSRC)
        decoder = OpusStreamDecoder()
        segmenter = VadSegmenter()
        for d in wire:
            r = receiver.accept(d)
            if isinstance(r, Accepted):
                segmenter.push(decoder.decode(r.opus_payload, r.lost_before))

    stages: dict[str, Callable[[], object]] = {
        "decrypt": decrypt,
        "decode": decode,
        "vad": vad,
        "decrypt_decode_vad": combined,
        "libopus_direct_decode": lambda: direct(packets),
        "opuslib_decoder_decode": opuslib_decode,
    }
    samples: dict[str, list[float]] = {name: [] for name in stages}
    for _ in range(REPEATS):  # interleaved, so drift hits every stage alike
        for name, fn in stages.items():
            samples[name].append(timed(fn, n))
    us = {name: round(min(v), 2) for name, v in samples.items()}
    median = {name: round(statistics.median(v), 2) for name, v in samples.items()}
    ratio = round(us["decrypt_decode_vad"] / us["libopus_direct_decode"], 2)
    median_ratio = round(median["decrypt_decode_vad"] / median["libopus_direct_decode"], 2)
    result = {
        "frames": n,
        "audio_s": round(n * 0.06, 2),
        "repeats": REPEATS,
        "us_per_frame_best": us,
        "us_per_frame_median": median,
        "ratio_combined_over_direct_decode": ratio,
        "ratio_combined_over_direct_decode_median": median_ratio,
        "ratio_decode_wrapper_over_direct": round(us["decode"] / us["libopus_direct_decode"], 2),
        # Capacity from the median pass (the conservative figure).
        "frames_per_core_second_combined": int(1e6 / median["decrypt_decode_vad"]),
        "realtime_streams_per_core_combined": int(60_000 / median["decrypt_decode_vad"]),
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "libopus": libopus_version(),
        },
    }
    rows = "\n".join(f"| {name} | {us[name]:.2f} | {median[name]:.2f} |" for name in us)
    record(
        "codec",
        result,
        "# Codec benchmark (python -m bench.codec_bench)\n\n"
        f"{n} real-speech frames of 60 ms ({result['audio_s']} s), 16 kHz mono Opus (VOIP), "
        f"{REPEATS} interleaved passes in one process.\n\n"
        "| stage | µs per 60 ms frame, best pass | median pass |\n|---|---|---|\n"
        f"{rows}\n\n"
        f"**decrypt + decode + VAD / direct libopus decode = {ratio}x** (best passes; "
        f"{median_ratio}x on medians; target ≤ 2x).\n"
        f"Decoder wrapper alone / direct libopus = {result['ratio_decode_wrapper_over_direct']}x. "
        f"On median passes one core sustains about "
        f"{result['realtime_streams_per_core_combined']} real-time uplink streams through the "
        "combined path.\n\n"
        f"Machine: {result['machine']}\n",
    )


if __name__ == "__main__":
    main()
