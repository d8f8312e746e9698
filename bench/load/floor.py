"""The streaming floor: the audio libraries called directly, no gateway code in between.

Per 60 ms frame: AES-128-CTR via ``cryptography`` (one CTR context per datagram, as the
protocol's per-datagram counter block requires), ``opus_decode`` through plain ctypes into one
preallocated buffer, two 30 ms ``webrtcvad`` decisions, in a bare loop over real speech. CPU
time is the measuring thread's own (``thread_time``).

Two ways to measure it:

* :func:`floor`: passes back to back (warm-up first), alone, before and after each gateway run;
* :class:`ThreadFloor`, *on the gateway's own thread* while it is measured
  (:mod:`bench.load.gateway_floor`): a short pass of ``FRAMES_PER_TICK`` frames every
  ``INTERVAL_S`` on the gateway's event loop, so the floor and the gateway's CPU per frame are
  taken on the same core, in the same seconds, beside the same neighbours. This VM's speed
  moves with what the other hardware thread of its core runs (the floor read 53-93 µs alone
  within one day, and ~1.5x slower beside a busy loop), so only a floor measured in the
  gateway's own conditions compares with the gateway. The ticks' CPU is reported and taken
  out of the gateway's figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
import statistics
import time
from collections.abc import Iterator
from typing import Any, Protocol

import webrtcvad
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from bench.scale_sender import speech_loop
from codec.udp import UplinkSender

FRAME_MS = 60
KEY = bytes.fromhex("00112233445566778899aabbccddeeff")
FLOOR_PASSES = 41
FLOOR_WARMUP = 3
INTERVAL_S = 0.5  # on the gateway's thread: one short pass per interval ...
FRAMES_PER_TICK = 60  # ... of 60 frames (~5 ms of CPU: about 1 % of the gateway's loop)


@functools.cache
def wire() -> tuple[bytes, ...]:
    """The floor's datagrams: the sender's speech loop (the frames the gateway decodes), sealed
    as a device seals them; built once per process (speech synthesis is not measured)."""
    sender = UplinkSender(key=KEY, ssrc=0x1234)
    return tuple(sender.seal(p, i * FRAME_MS) for i, p in enumerate(speech_loop() * 4))


class FloorPass(Protocol):
    def __call__(self, frames: int | None = None) -> float: ...


@contextlib.contextmanager
def floor_loop() -> Iterator[FloorPass]:
    """A bare loop over :func:`wire` with one decoder and one VAD. Each call of the yielded
    function decodes the next ``frames`` datagrams (the whole loop once by default; in order,
    wrapping round) and returns this thread's CPU µs per frame."""
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
    cycle = datagrams * 2
    at = 0

    def one_pass(frames: int | None = None) -> float:
        nonlocal at
        batch = datagrams if frames is None else cycle[at : at + min(frames, len(datagrams))]
        at = (at + len(batch)) % len(datagrams)
        t0 = clock()
        for d in batch:
            payload = Cipher(aes, modes.CTR(d[:16])).encryptor().update(d[16:])
            n = decode(state, payload, len(payload), buf, 1920, 0)
            pcm = string_at(buf, 2 * n)
            is_speech(pcm[:960], 16000)
            is_speech(pcm[960:], 16000)
        return (clock() - t0) / len(batch) * 1e6

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


class ThreadFloor:
    """The floor measured on the calling thread (the gateway's event loop) every ``interval_s``:
    ``samples`` are ``(monotonic start, CPU s, frames)`` per tick."""

    def __init__(self, interval_s: float = INTERVAL_S, frames: int = FRAMES_PER_TICK) -> None:
        if not 0 < frames <= len(wire()):
            raise ValueError(f"frames must be 1..{len(wire())} (one pass of the loop at most)")
        self.interval_s, self.frames = interval_s, frames
        self.samples: list[tuple[float, float, int]] = []
        self._stack = contextlib.ExitStack()
        self._pass = self._stack.enter_context(floor_loop())
        self._pass(frames)  # first touch (decoder state, VAD, code) before any tick counts
        self._handle: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._handle = loop.call_later(self.interval_s, self._tick, loop)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._stack.close()

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        started = time.monotonic()
        us = self._pass(self.frames)
        self.samples.append((started, us * self.frames / 1e6, self.frames))
        self._handle = loop.call_later(self.interval_s, self._tick, loop)


def window_floor(samples: list[list[float]], start: float, end: float) -> dict[str, Any]:
    """The ticks that started in ``[start, end)`` (monotonic): total CPU / total frames, the
    statistic the gateway's figure is, and their CPU (to take out of the gateway's)."""
    inside = [s for s in samples if start <= s[0] < end]
    cpu = sum(s[1] for s in inside)
    frames = sum(int(s[2]) for s in inside)
    per_tick = [s[1] / s[2] * 1e6 for s in inside]
    mean = cpu / frames * 1e6 if frames else 0.0
    return {
        "ticks": len(inside),
        "frames": frames,
        "cpu_s": round(cpu, 4),
        "us_per_frame_mean": round(mean, 2),
        "us_per_frame_min": round(min(per_tick, default=0.0), 2),
        "us_per_frame_max": round(max(per_tick, default=0.0), 2),
        "sessions_per_core": int(FRAME_MS * 1000 / mean) if mean else 0,
    }
