"""Streaming capacity: the floor (the libraries called directly) vs the gateway's real path.

*Floor*: per 60 ms frame, AES-128-CTR via ``cryptography`` (one CTR context per datagram, as
the protocol's per-datagram counter block requires), ``opus_decode`` through plain ctypes into
one preallocated buffer, two 30 ms ``webrtcvad`` decisions, in a bare loop over real speech.
CPU time per frame (process time, median of passes) → sessions per core = 60 ms / that.

*Gateway*: K simulated devices stream the same kind of speech in real time
(:mod:`bench.scale_sender` in its own process: hellos over MQTT, then AES-CTR datagrams over
UDP, spread over each 60 ms tick) to the gateway in its own process, with every session
listening (decrypt + decode + VAD). Over a steady window: the gateway process's CPU time,
datagrams sent vs received, every drop counter. Sessions per core at K = K / (CPU share).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import webrtcvad
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from bench.load.procs import Meter
from bench.scale_sender import running_sender, speech_loop
from codec.udp import UplinkSender
from devstack.broker import local_broker
from devstack.gateway import Use, gateway_sections
from devstack.process import gateway_process

FRAME_MS = 60
WARMUP_S = 3.0
KEY = bytes.fromhex("00112233445566778899aabbccddeeff")
FLOOR_PASSES = 41
FLOOR_WARMUP = 3


def device_ids(k: int) -> list[str]:
    return [f"a2_00_00_00_{i >> 8:02x}_{i & 0xFF:02x}" for i in range(k)]


@functools.cache
def _wire() -> tuple[bytes, ...]:
    """The floor's datagrams: the sender's speech loop (the frames the gateway decodes), sealed
    as a device seals them; built once per process (speech synthesis is not measured)."""
    sender = UplinkSender(key=KEY, ssrc=0x1234)
    return tuple(sender.seal(p, i * FRAME_MS) for i, p in enumerate(speech_loop() * 4))


def floor(passes: int = FLOOR_PASSES, warmup: int = FLOOR_WARMUP) -> dict[str, Any]:
    """µs of CPU per frame for decrypt + decode + VAD with no gateway code in between.

    Each pass decodes the whole speech loop once (~30 ms of CPU); ``warmup`` passes run first
    and are not counted (a fresh decoder state, cold caches). CPU time is this thread's
    (``thread_time``: nothing else the harness process runs is counted)."""
    wire = _wire()
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
        for d in wire:
            payload = Cipher(aes, modes.CTR(d[:16])).encryptor().update(d[16:])
            n = decode(state, payload, len(payload), buf, 1920, 0)
            pcm = string_at(buf, 2 * n)
            is_speech(pcm[:960], 16000)
            is_speech(pcm[960:], 16000)
        return (clock() - t0) / len(wire) * 1e6

    try:
        for _ in range(warmup):
            one_pass()
        samples = sorted(one_pass() for _ in range(passes))
    finally:
        lib.opus_decoder_destroy(state)
    median = statistics.median(samples)
    return {
        "measured_utc": time.strftime("%H:%M:%SZ", time.gmtime()),
        "frames_per_pass": len(wire),
        "passes": passes,
        "warmup_passes": warmup,
        "us_per_frame_median": round(median, 2),
        "us_per_frame_best": round(samples[0], 2),
        "us_per_frame_p90": round(samples[int(0.9 * (len(samples) - 1))], 2),
        "sessions_per_core": int(FRAME_MS * 1000 / median),
    }


async def start_profiler(
    pid: int, seconds: float, out: Path | None
) -> asyncio.subprocess.Process | None:
    """py-spy (if installed) sampling ``pid`` for ``seconds``: collapsed stacks into ``out``."""
    spy = Path(sys.executable).with_name("py-spy")
    if out is None or not spy.exists():
        return None
    return await asyncio.create_subprocess_exec(
        str(spy), "record", "--nonblocking", "-p", str(pid), "-d", str(int(seconds)),
        "-r", "250", "-f", "raw", "-o", str(out), stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip


def _counter(m: dict[str, float], name: str) -> float:
    return m.get(f"snlpgw_xiaozhi_{name}_total", 0.0)


def _drops(m: dict[str, float]) -> dict[str, float]:
    prefix = "snlpgw_xiaozhi_udp_dropped_total{"
    return {k[len(prefix) : -1]: v for k, v in m.items() if k.startswith(prefix) and v}


async def gateway_run(
    k: int, root: Path, measure_s: float, *, profile: Path | None = None
) -> dict[str, Any]:
    async with local_broker(root / "data") as broker:
        settings = gateway_sections(broker, gateway_id="load-gw", use=Use.LOAD)
        devs = device_ids(k)
        async with gateway_process(root, settings, listen=devs) as gw:
            async with running_sender(
                root / "sender.json", host=broker.host, port=broker.port,
                password=settings["mqtt"]["password"], devices=devs,
                seconds=WARMUP_S + measure_s + 1.0, ready_s=240,
            ) as proc:  # fmt: skip
                ready = proc.ready
                await asyncio.sleep(WARMUP_S)
                meter = Meter(
                    {"gateway": gw.pid, "broker": broker.local_pid, "sender": proc.proc.pid}
                )
                before = await asyncio.to_thread(gw.metrics)
                meter.start()
                spy = await start_profiler(gw.pid, measure_s, profile)
                await asyncio.sleep(measure_s)
                cpu = meter.stop()
                if spy is not None:
                    await spy.wait()
                after = await asyncio.to_thread(gw.metrics)
                sent = await proc.totals(120)
            total = await asyncio.to_thread(gw.metrics)
    frames = _counter(after, "opus_frames_decoded") - _counter(before, "opus_frames_decoded")
    drops = _drops(total)
    queue_dropped = _counter(total, "audio_queue_dropped")
    received = _counter(total, "udp_packets_in")
    lost = sent["sent"] - received
    return {
        "sessions": k,
        "sessions_opened": ready["sessions"],
        **cpu,
        "frames_decoded_in_window": frames,
        "gateway_us_per_frame": round(cpu["gateway_cpu_s"] * 1e6 / frames, 2) if frames else None,
        "sessions_per_core": int(FRAME_MS * 1000 / (cpu["gateway_cpu_s"] * 1e6 / frames))
        if frames and cpu["gateway_cpu_s"]
        else None,
        "datagrams_sent": sent["sent"],
        "datagrams_received": received,
        "lost_before_gateway": lost,
        "dropped_in_gateway": drops,
        "audio_queue_dropped": queue_dropped,
        "zero_drops": lost == 0 and not drops and queue_dropped == 0,
        "sender_late_ticks": sent["late_ticks"],
    }


def summarize(floors: list[dict[str, Any]], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The floor and the gateway's best sessions/core among the runs with zero drops (CPU time
    per frame). ``floors``: the floor measured before each run and after the last, interleaved
    with the sweep so every run has one on each side; the fastest of them is THE floor (the
    stricter comparison), and each run is also compared with the faster of its two neighbours
    (``adjacent``: same machine conditions, give or take a few seconds)."""
    floor_ = min(floors, key=lambda f: f["us_per_frame_median"])
    ok = [r for r in runs if r["zero_drops"] and r["gateway_us_per_frame"]]
    best = min(ok or runs, key=lambda r: r["gateway_us_per_frame"] or float("inf"))
    us = best["gateway_us_per_frame"]
    gateway_per_core = int(FRAME_MS * 1000 / us) if us else 0
    adjacent = []
    for r in runs:
        i = r.get("floor_index", 0)
        near = min(f["us_per_frame_median"] for f in floors[i : i + 2])
        run_us = r["gateway_us_per_frame"]
        ratio = round(near / run_us, 2) if run_us else None
        adjacent.append({"sessions": r["sessions"], "floor_us": near, "ratio": ratio})
    return {
        "floor": floor_,
        "floor_before": floors[0],
        "floor_after": floors[-1],
        "floors": floors,
        "adjacent": adjacent,
        "runs": runs,
        "gateway_best_run_sessions": best["sessions"],
        "gateway_best_run_zero_drops": best["zero_drops"],
        "gateway_us_per_frame": us,
        "gateway_sessions_per_core": gateway_per_core,
        "ratio_to_floor": round(gateway_per_core / floor_["sessions_per_core"], 2),
        "largest_k_zero_drops": max((r["sessions"] for r in ok), default=0),
    }
