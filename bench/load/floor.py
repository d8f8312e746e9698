"""The streaming floor: the audio libraries called directly, no gateway code in between.

Per 60 ms frame: AES-128-CTR via ``cryptography`` (one CTR context per datagram, as the
protocol's per-datagram counter block requires), ``opus_decode`` through plain ctypes into one
preallocated buffer, two 30 ms ``webrtcvad`` decisions, in a bare loop over real speech. CPU
time is the measuring thread's own (``thread_time``).

Two ways to measure it:

* :func:`floor`: passes back to back (warm-up first), before and after each gateway run;
* the *in-window probe* (``python -m bench.load.floor SECONDS``): a process of its own that,
  while the gateway is measured, runs one warm-up pass and one measured pass every
  ``INTERVAL_S`` on the other core: the floor in the same seconds as the gateway's CPU per
  frame (this host's speed changes within seconds), as total CPU / total frames over the
  window, the statistic the gateway's figure is. It is *not* the gateway's conditions: on this
  VM a busy neighbour core slows a core's work ~1.5x (the floor read 55-64 µs alone and
  86-89 µs beside a busy loop, same minutes), and the probe always runs beside the busy
  gateway while the gateway mostly runs beside an idle core (the sender, the broker and the
  probe use ~20 % of it). So the ratio against the probe's floor over-states (an upper bound);
  the ratio against :func:`floor` measured alone under-states a little (a lower bound).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import webrtcvad
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from bench.scale_sender import speech_loop
from codec.udp import UplinkSender

FRAME_MS = 60
KEY = bytes.fromhex("00112233445566778899aabbccddeeff")
FLOOR_PASSES = 41
FLOOR_WARMUP = 3
INTERVAL_S = 0.25  # the in-window probe: one warm-up + one measured pass (~60 ms) per interval


@functools.cache
def wire() -> tuple[bytes, ...]:
    """The floor's datagrams: the sender's speech loop (the frames the gateway decodes), sealed
    as a device seals them; built once per process (speech synthesis is not measured)."""
    sender = UplinkSender(key=KEY, ssrc=0x1234)
    return tuple(sender.seal(p, i * FRAME_MS) for i, p in enumerate(speech_loop() * 4))


@contextlib.contextmanager
def floor_loop() -> Iterator[Callable[[], float]]:
    """A bare loop over :func:`wire` with one decoder and one VAD: each call of the yielded
    function decodes every datagram once and returns this thread's CPU µs per frame."""
    datagrams = wire()
    lib = ctypes.CDLL(ctypes.util.find_library("opus") or "libopus.so.0")
    lib.opus_decoder_create.restype = ctypes.c_void_p
    lib.opus_decoder_create.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int))
    lib.opus_decoder_destroy.argtypes = (ctypes.c_void_p,)
    decode = lib.opus_decode
    decode.restype = ctypes.c_int
    decode.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32,
                       ctypes.POINTER(ctypes.c_int16), ctypes.c_int, ctypes.c_int)  # fmt: skip
    err = ctypes.c_int()
    state = lib.opus_decoder_create(16000, 1, ctypes.byref(err))
    buf = (ctypes.c_int16 * 1920)()
    vad = webrtcvad.Vad(2)
    aes = algorithms.AES(KEY)
    string_at, is_speech, clock = ctypes.string_at, vad.is_speech, time.thread_time

    def one_pass() -> float:
        t0 = clock()
        for d in datagrams:
            payload = Cipher(aes, modes.CTR(d[:16])).encryptor().update(d[16:])
            n = decode(state, payload, len(payload), buf, 1920, 0)
            pcm = string_at(buf, 2 * n)
            is_speech(pcm[:960], 16000)
            is_speech(pcm[960:], 16000)
        return (clock() - t0) / len(datagrams) * 1e6

    try:
        yield one_pass
    finally:
        lib.opus_decoder_destroy(state)


def floor(passes: int = FLOOR_PASSES, warmup: int = FLOOR_WARMUP) -> dict[str, Any]:
    """µs of CPU per frame, passes back to back. Each pass decodes the whole speech loop once
    (~30 ms of CPU); ``warmup`` passes run first and are not counted (a fresh decoder state,
    cold caches)."""
    with floor_loop() as one_pass:
        for _ in range(warmup):
            one_pass()
        samples = sorted(one_pass() for _ in range(passes))
    median = statistics.median(samples)
    return {
        "measured_utc": time.strftime("%H:%M:%SZ", time.gmtime()),
        "frames_per_pass": len(wire()),
        "passes": passes,
        "warmup_passes": warmup,
        "us_per_frame_median": round(median, 2),
        "us_per_frame_best": round(samples[0], 2),
        "us_per_frame_p90": round(samples[int(0.9 * (len(samples) - 1))], 2),
        "sessions_per_core": int(FRAME_MS * 1000 / median),
    }


def probe(seconds: float, interval_s: float = INTERVAL_S) -> dict[str, Any]:
    """The in-window floor: for ``seconds``, a warm-up pass then a measured pass every
    ``interval_s``; the mean over the measured passes (equal-sized, so total CPU / frames)."""
    samples: list[float] = []
    cpu0 = time.process_time()
    with floor_loop() as one_pass:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            one_pass()
            samples.append(one_pass())
            time.sleep(interval_s)
    mean = statistics.fmean(samples) if samples else 0.0
    return {
        "passes": len(samples),
        "interval_s": interval_s,
        "cpu_s": round(time.process_time() - cpu0, 3),  # the probe's own load on the machine
        "us_per_frame_mean": round(mean, 2),
        "us_per_frame_min": round(min(samples, default=0.0), 2),
        "us_per_frame_max": round(max(samples, default=0.0), 2),
        "sessions_per_core": int(FRAME_MS * 1000 / mean) if mean else 0,
    }


def main(argv: list[str]) -> int:
    """``python -m bench.load.floor SECONDS``: prepares (speech, first pass), prints ``ready``,
    waits for a line on stdin, then probes for SECONDS and prints the result as JSON."""
    seconds = float(argv[0])
    with floor_loop() as one_pass:
        one_pass()
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(probe(seconds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
