"""Hello phase: N Xiaozhi devices, each its own MQTT connection, in worker processes.

Staggered: every device says hello ``per_device`` times at evenly spread instants over
``span_s`` (the first round opens N sessions; the rest run with all N open). Burst: all N
devices at the same instant. Figure: device publish → hello reply received; the gateway's own
handling time (receipt → reply queued) from its metrics beside it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from bench.load.lessons import provision_all, quantile_stats, wait_accepted
from bench.load.procs import Meter, place_gateway
from bench.load.stack import split, workers
from bench.stats import summary
from devstack.broker import local_broker
from devstack.gateway import Use, gateway_sections
from devstack.process import gateway_process

START_LEAD_S = 1.0


def device_ids(n: int) -> list[str]:
    return [f"c3_00_00_00_{i >> 8:02x}_{i & 0xFF:02x}" for i in range(n)]


async def run(n: int, root: Path, *, per_device: int, span_s: float,
              worker_count: int, settings: dict[str, Any] | None = None,
              place: bool = True) -> dict[str, Any]:  # fmt: skip
    async with local_broker(root / "data") as broker:
        devs = await asyncio.to_thread(
            provision_all, broker, dict.fromkeys(device_ids(n), "device")
        )
        last = device_ids(n)[-1]  # written last: accepted means every device was read
        await wait_accepted(broker, {last: devs[last]})
        # Hello k of device i at (k·n + i)/(n·per_device) of the span: evenly spread, in rounds.
        total = n * per_device
        staggered = [[span_s * (k * n + i) / total for k in range(per_device)] for i in range(n)]
        burst = [[0.0] for _ in range(n)]
        specs = [
            {
                "host": broker.host,
                "port": broker.port,
                "devices": dict(share),
                "schedules": {"staggered": st, "burst": bu},
            }
            for share, st, bu in zip(
                split(list(devs.items()), worker_count),
                split(staggered, worker_count),
                split(burst, worker_count),
                strict=True,
            )
        ]
        async with (
            gateway_process(
                root,
                gateway_sections(broker, gateway_id="load-gw", use=Use.LOAD, **(settings or {})),
            ) as gw,
            workers("bench.load.devices", specs, root) as procs,
        ):
            for proc in procs:
                await proc.line(180)
            placement = place_gateway(gw.pid, [broker.local_pid, *(p.pid for p in procs)], on=place)
            # Workers exit right after their last report, so they measure their own CPU.
            pids = {"gateway": gw.pid, "broker": broker.local_pid}
            phases: dict[str, Any] = {}
            for phase in ("staggered", "burst"):
                meter = Meter(pids)
                meter.start()
                t0 = time.time() + START_LEAD_S
                for proc in procs:
                    proc.go(t0)
                for proc in procs:
                    await proc.line(span_s + 120)
                phases[phase] = meter.stop()
                await asyncio.sleep(1.0)
            found = [await proc.line(60) for proc in procs]
            for phase, cpu in phases.items():
                devices_cpu = sum(f[phase]["cpu_s"] for f in found)
                cpu["devices_cpu_s"] = round(devices_cpu, 3)
                cpu["others_core_share"] = round(
                    max(0.0, cpu["others_core_share"] - devices_cpu / cpu["wall_s"]), 3
                )
            figures = await asyncio.to_thread(gw.metrics)
    out: dict[str, Any] = {
        "sessions": n,
        "placement": placement,
        "gateway_handling_ms_last_2048": quantile_stats(figures, "xiaozhi_hello_handling_ms"),
        "gateway_gc_full_pause_ms": quantile_stats(figures, "gc_full_pause_ms"),
    }
    for phase in ("staggered", "burst"):
        samples = [x for f in found for x in f[phase]["latency_ms"]]
        out[phase] = {
            "hellos": len(samples) + sum(f[phase]["no_reply"] for f in found),
            "no_reply": sum(f[phase]["no_reply"] for f in found),
            "rate_per_s": round(total / span_s, 1) if phase == "staggered" else None,
            "hello_to_reply_ms": summary(samples),
            **phases[phase],
            "samples_ms": samples,
        }
    return out
