"""Gateway-internal cost of one Xiaozhi hello at 1,000 open sessions (issue 12: hello → reply).

Run from the repo root: ``python -m bench.hello_core_bench``. No broker and no sockets: the
channel is built as in production but with a publisher that only records (the tests' fake,
``tests/support/fake_mqtt.py``) and a UDP endpoint on
a transport that sends nothing, so what is measured is exactly what the gateway does per hello
on its loop — topic check, JSON parse, the session core (rate limit, cap, replace, fresh key,
ssrc and session id), the live session state (crypto contexts, pipeline, buckets), the reply
JSON and the MQTT publish call. 1,000 devices say hello once (1,000 sessions open), then every
one of them says hello again ``ROUNDS`` times (each replaces its own session, so 1,000 stay
open). Reports CPU per hello (process time / hellos) and the per-hello wall time p50/p99/max.
Writes bench/results/hello_core.json and hello_core.md.
"""

from __future__ import annotations

import asyncio
import gc
import platform
import sys
import time
from typing import Any

from bench.stats import quantile, record
from gateway.metrics import Metrics
from gateway.mqtt.edge import Inbound
from gateway.settings import Settings
from gateway.simulators.xiaozhi import hello_json
from gateway.xiaozhi.channel import XiaozhiChannel
from tests.support.fake_mqtt import FakePublisher

SESSIONS = 1000
ROUNDS = 5


class SilentTransport(asyncio.DatagramTransport):
    def sendto(self, data: Any, addr: Any = None) -> None:
        return None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 48884) if name == "sockname" else default


def bench_settings(sessions: int = SESSIONS) -> Settings:
    """UDP on any port, room and hello budget for ``sessions`` sessions opened at once."""
    return Settings(
        udp={"port": 0, "public_host": "gw.example", "public_port": 8884},
        xiaozhi={"max_sessions": sessions, "hello_burst": 1000, "hellos_per_minute": 60_000},
    )


def hello_messages(sessions: int = SESSIONS) -> list[Inbound]:
    """One hello each from ``sessions`` devices, as the MQTT client hands them over."""
    body = hello_json()
    return [
        Inbound(
            topic=f"device-server/a6_00_00_00_{i >> 8:02x}_{i & 0xFF:02x}",
            payload=body,
            qos=0,
            retain=False,
            received_mono=0.0,
            received_ms=0,
        )
        for i in range(sessions)
    ]


def bench_channel(sessions: int = SESSIONS) -> tuple[XiaozhiChannel, FakePublisher]:
    """The Xiaozhi channel built as in production, serving, with a recording publisher and a
    UDP transport that sends nothing (no broker, no socket)."""
    mqtt = FakePublisher()
    channel = XiaozhiChannel(
        settings=bench_settings(sessions), mqtt=mqtt, metrics=Metrics(), http=None, admin=None
    )
    channel.udp_endpoint.connection_made(SilentTransport())
    channel.bound()
    return channel, mqtt


def run() -> dict[str, Any]:
    channel, mqtt = bench_channel()
    ((_, handle, _),) = mqtt.routes
    messages = hello_messages()
    for msg in messages:  # warm-up: 1,000 sessions open
        handle(msg)
    assert len(channel.core) == SESSIONS
    gc.collect()
    walls: list[float] = []
    cpu0 = time.process_time()
    for _ in range(ROUNDS):
        for msg in messages:
            t0 = time.perf_counter()
            handle(msg)
            walls.append((time.perf_counter() - t0) * 1e6)
    cpu = time.process_time() - cpu0
    assert len(channel.core) == SESSIONS
    hellos = ROUNDS * SESSIONS
    assert len(mqtt.sent) == SESSIONS + hellos
    return {
        "benchmark": "xiaozhi hello handled in-process at 1,000 open sessions (no broker)",
        "sessions_open": SESSIONS,
        "hellos": hellos,
        "cpu_us_per_hello": round(cpu * 1e6 / hellos, 1),
        "wall_us": {
            "p50": round(quantile(walls, 0.5), 1),
            "p99": round(quantile(walls, 0.99), 1),
            "max": round(max(walls), 1),
        },
        "machine": {"python": platform.python_version(), "cpu": platform.machine()},
    }


def markdown(result: dict[str, Any], note: str) -> str:
    wall = result["wall_us"]
    return "\n".join(
        [
            "# Xiaozhi hello: gateway-internal cost",
            "",
            f"{result['benchmark']}. `python -m bench.hello_core_bench`.",
            "",
            "| sessions open | hellos | CPU µs/hello | wall p50 µs | wall p99 µs | wall max µs |",
            "|---|---|---|---|---|---|",
            f"| {result['sessions_open']} | {result['hellos']} | {result['cpu_us_per_hello']} "
            f"| {wall['p50']} | {wall['p99']} | {wall['max']} |",
            "",
            note,
            "",
        ]
    )


def main() -> None:
    result = run()
    note = " ".join(sys.argv[1:]) or "Machine shared with other work while measured."
    record("hello_core", result, markdown(result, note))


if __name__ == "__main__":
    main()
