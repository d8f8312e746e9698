"""OTA request cost: first contact, a bound board asking again, a spoofed Client-Id, a flood.

Run from the repo root: ``python -m bench.ota_bench``. Starts a local Mosquitto with the
project's config and a real gateway (service + Xiaozhi channel, the production provisioner:
broker files, SIGHUP, "broker accepts" poll). One aiohttp client sends, one request at a time:

* **first contact** — a new MAC: binding persisted, broker user created, broker reloaded and
  polled until it accepts the password (what *every* request cost before the trust model,
  which rotated the password each time);
* **bound repeat** — the bound board asking again: derived password, one locked read of the
  broker files, no write, no reload;
* **spoofed** — another Client-Id for a bound MAC: an activation answer from memory;
* **flood refused** — default rate limits, new MACs from one host: 429 answers.

Writes bench/results/ota.json and bench/results/ota.md.
"""

from __future__ import annotations

import asyncio
import platform
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from bench.stats import quantile, record
from devstack.gateway import Use
from tests.integration.xiaozhi_support import XiaozhiGateway, new_mac, running_gateway
from tests.support.broker import start_broker

FIRST_CONTACTS = 40
REPEATS = 400
FLOOD = 2000
ROOMY = {"ota_ip_burst": 100_000, "ota_mac_burst": 100_000, "ota_users_per_hour": 10_000}


def summary(samples_ms: list[float]) -> dict[str, float]:
    def q(p: float) -> float:
        return round(quantile(samples_ms, p), 3)

    return {"count": len(samples_ms), "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": q(1.0)}


async def timed(
    http: aiohttp.ClientSession, gw: XiaozhiGateway, mac: str, client: str, want: int
) -> float:
    headers = {"Device-Id": mac, "Client-Id": client, "User-Agent": "bench/1.0"}
    t0 = time.perf_counter()
    async with http.post(gw.ota_url, headers=headers, json={}) as resp:
        await resp.read()
        if resp.status != want:
            raise RuntimeError(f"OTA answered {resp.status}, expected {want}")
    return (time.perf_counter() - t0) * 1000


async def run(data_dir: Path) -> dict[str, Any]:
    broker = start_broker(data_dir)
    try:
        async with aiohttp.ClientSession() as http:
            async with running_gateway(
                broker, production_provisioner=True, use=Use.LOAD, **ROOMY
            ) as gw:
                board_mac, board = new_mac(), str(uuid.uuid4())
                first = [
                    await timed(http, gw, new_mac(), str(uuid.uuid4()), 200)
                    for _ in range(FIRST_CONTACTS)
                ]
                await timed(http, gw, board_mac, board, 200)
                repeat = [await timed(http, gw, board_mac, board, 200) for _ in range(REPEATS)]
                spoof = str(uuid.uuid4())
                spoofed = [await timed(http, gw, board_mac, spoof, 200) for _ in range(REPEATS)]
            async with running_gateway(broker, production_provisioner=True, use=Use.LOAD) as gw:
                t0 = time.perf_counter()
                statuses: dict[int, int] = {}
                for _ in range(FLOOD):
                    headers = {"Device-Id": new_mac(), "Client-Id": str(uuid.uuid4())}
                    async with http.post(gw.ota_url, headers=headers, json={}) as resp:
                        await resp.read()
                        statuses[resp.status] = statuses.get(resp.status, 0) + 1
                flood_s = time.perf_counter() - t0
    finally:
        broker.stop()
    return {
        "benchmark": "OTA request -> answer, one aiohttp client, one request at a time",
        "broker": f"mosquitto ({broker.kind}), localhost; production provisioner",
        "machine": {
            "python": platform.python_version(),
            "cpu": platform.processor() or platform.machine(),
        },
        "first_contact": summary(first),
        "bound_repeat": summary(repeat),
        "spoofed_client_id": summary(spoofed),
        "flood_default_limits": {
            "requests": FLOOD,
            "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "requests_per_s": round(FLOOD / flood_s, 1),
        },
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# OTA request cost",
        "",
        f"{result['benchmark']}; {result['broker']}. `python -m bench.ota_bench`.",
        "",
        "| request | count | p50 ms | p99 ms | max ms |",
        "|---|---|---|---|---|",
    ]
    for key in ("first_contact", "bound_repeat", "spoofed_client_id"):
        s = result[key]
        lines.append(f"| {key} | {s['count']} | {s['p50_ms']} | {s['p99_ms']} | {s['max_ms']} |")
    flood = result["flood_default_limits"]
    lines += [
        "",
        f"Flood of {flood['requests']} new MACs from one host with the default limits: "
        f"answers {flood['statuses']} at {flood['requests_per_s']} requests/s "
        "(client and gateway share one event loop).",
        "",
        "First contact writes the binding and the broker files, reloads the broker and polls it",
        "until it accepts the password; before the trust model every OTA request did that (it",
        "rotated the password). A bound board asking again now only reads the files.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="ota-bench-") as tmp:
        result = asyncio.run(run(Path(tmp)))
    record("ota", result, markdown(result))


if __name__ == "__main__":
    main()
