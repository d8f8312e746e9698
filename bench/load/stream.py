"""Streaming capacity: the floor (the libraries called directly) vs the gateway's real path.

*Floor* (:mod:`bench.load.floor`): per 60 ms frame, AES-128-CTR, ``opus_decode`` via ctypes,
two 30 ms ``webrtcvad`` decisions, in a bare loop over real speech; measured before each run
and after the last (alone: the strict comparison), and *in the window* by a probe process
sampling it beside the running gateway (an upper bound of the ratio, see
:mod:`bench.load.floor`). Sessions per core = 60 ms / CPU per frame.

*Gateway*: K simulated devices stream the same kind of speech in real time
(:mod:`bench.scale_sender` in its own process: hellos over MQTT, then AES-CTR datagrams over
UDP, spread over each 60 ms tick) to the gateway in its own process, with every session
listening (decrypt + decode + VAD). Over a steady window: the gateway process's CPU time,
datagrams sent vs received, every drop counter. Sessions per core at K = K / (CPU share).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bench.load.floor import FRAME_MS
from bench.load.procs import Meter
from bench.scale_sender import running_sender
from devstack.broker import local_broker
from devstack.gateway import Use, gateway_sections
from devstack.process import gateway_process

WARMUP_S = 3.0
PROBE_READY_S = 120.0  # the in-window floor probe's start-up (speech synthesis, first pass)


def device_ids(k: int) -> list[str]:
    return [f"a2_00_00_00_{i >> 8:02x}_{i & 0xFF:02x}" for i in range(k)]


@contextlib.asynccontextmanager
async def floor_probe(seconds: float) -> AsyncIterator[asyncio.subprocess.Process]:
    """The in-window floor probe (:mod:`bench.load.floor`), started and ready (before the
    sender, so its start-up costs the sender's timing nothing); it measures once
    :func:`release_probe` lets it go, and is killed on the way out if still running."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.load.floor", str(seconds),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(PROBE_READY_S):
            line = await proc.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"floor probe did not start: {line!r}")
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def release_probe(proc: asyncio.subprocess.Process) -> None:
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")


async def probe_result(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    assert proc.stdout is not None
    line = await proc.stdout.readline()
    await proc.wait()
    result: dict[str, Any] = json.loads(line)
    return result


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
        async with (
            gateway_process(root, settings, listen=devs) as gw,
            floor_probe(measure_s) as probe,
        ):
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
                release_probe(probe)
                spy = await start_profiler(gw.pid, measure_s, profile)
                await asyncio.sleep(measure_s)
                window_floor = await probe_result(probe)  # it stops as the window ends
                cpu = meter.stop({"floor_probe": window_floor["cpu_s"]})
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
        "window_floor": window_floor,
        "window_ratio": round(
            window_floor["us_per_frame_mean"] / (cpu["gateway_cpu_s"] * 1e6 / frames), 2
        )
        if frames and cpu["gateway_cpu_s"]
        else None,
    }


def summarize(floors: list[dict[str, Any]], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The floor and the gateway's best sessions/core among the runs with zero drops (CPU time
    per frame). ``floors``: the floor measured before each run and after the last, interleaved
    with the sweep so every run has one on each side; the fastest of them is THE floor (the
    stricter comparison), and each run is also compared with the faster of its two neighbours
    (``adjacent``: same machine conditions, give or take a few seconds). Each run also carries
    ``window_ratio``: against the floor the probe sampled beside the gateway during that run's
    own window (an upper bound, :mod:`bench.load.floor`); the best of those among drop-free
    runs is ``window_ratio_best``."""
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
    in_window = [r for r in ok if r.get("window_ratio")]
    window_best = max(in_window, key=lambda r: r["window_ratio"], default=None)
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
        # The same comparison against the floor sampled in each run's own window (floor.py).
        "window_ratio_best": window_best["window_ratio"] if window_best else None,
        "window_ratio_best_sessions": window_best["sessions"] if window_best else None,
    }
