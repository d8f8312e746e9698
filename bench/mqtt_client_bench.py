"""MQTT client microbenchmark: CPU per message through a real Mosquitto, per client library.

``python -m bench.mqtt_client_bench [--messages N] [--out FILE]``

One client subscribes to a topic and publishes ``N`` QoS 1 messages to it, ``WINDOW`` awaiting
their PUBACK at once (as the gateway does), so each message costs the client one PUBLISH out,
one PUBACK in, one PUBLISH in and one PUBACK out: what the gateway pays per board message and
per command. The figure is the client process's CPU time per message (contention-insensitive;
the broker runs in its own process). Clients: the gateway's own (``gateway.mqtt.client``) and
aiomqtt on paho-mqtt (what the gateway used before).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiomqtt

from devstack.broker import Broker, local_broker
from gateway.broker.credentials import gateway_password
from gateway.broker.rules import GATEWAY_USERNAME
from gateway.mqtt.client import Client
from gateway.mqtt.options import ClientOptions

WINDOW = 20
TOPIC = "snlp/v1/aa_bb_cc_dd_ee_ff/status"  # the gateway user may write and read it
_EVENT = {
    "v": 1,
    "id": "e1",
    "ts": 1764460800123,
    "ref": "c1",
    "evt": "audio.completed",
    "data": {"name": "/english_learning/shadowing/lessons/unit01/01.mp3", "duration_ms": 2140},
}
PAYLOAD = json.dumps(_EVENT).encode()  # a typical board event

Runner = Callable[[Broker, str, int], Awaitable[None]]


async def lean(broker: Broker, password: str, n: int) -> None:
    received = 0
    done = asyncio.Event()

    def on_message(_: Any) -> None:
        nonlocal received
        received += 1
        if received >= n:
            done.set()

    options = ClientOptions(client_id="bench-lean", username=GATEWAY_USERNAME, password=password)
    client = Client(options, on_message)
    await client.connect(broker.host, broker.port)
    await client.subscribe([(TOPIC, 1)])
    window = asyncio.Semaphore(WINDOW)
    for _ in range(n):
        await window.acquire()
        client.publish(TOPIC, PAYLOAD, qos=1, on_done=window.release)
    await done.wait()
    await client.disconnect()


async def aiomqtt_paho(broker: Broker, password: str, n: int) -> None:
    async with aiomqtt.Client(
        broker.host, broker.port, username=GATEWAY_USERNAME, password=password,
        identifier="bench-aiomqtt", protocol=aiomqtt.ProtocolVersion.V5,
        max_inflight_messages=WINDOW,
    ) as client, asyncio.TaskGroup() as tg:  # fmt: skip
        client.pending_calls_threshold = WINDOW + 10
        await client.subscribe(TOPIC, qos=1)
        window = asyncio.Semaphore(WINDOW)

        async def one() -> None:
            try:
                await client.publish(TOPIC, PAYLOAD, qos=1)
            finally:
                window.release()

        async def receive() -> None:
            count = 0
            async for _ in client.messages:
                count += 1
                if count >= n:
                    return

        receiver = tg.create_task(receive())
        for _ in range(n):
            await window.acquire()
            tg.create_task(one())
        await receiver


RUNNERS: dict[str, Runner] = {"gateway.mqtt.client": lean, "aiomqtt+paho": aiomqtt_paho}


async def measure(n: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        async with local_broker(Path(tmp) / "broker") as broker:
            password = gateway_password(broker.data_dir)
            for name, runner in RUNNERS.items():
                await runner(broker, password, min(n, 500))  # warm-up
                cpu0, wall0 = time.process_time(), time.perf_counter()
                await runner(broker, password, n)
                cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
                results[name] = {
                    "messages": n,
                    "cpu_us_per_message": round(cpu / n * 1e6, 1),
                    "messages_per_cpu_second": round(n / cpu),
                    "wall_s": round(wall, 2),
                }
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = asyncio.run(measure(args.messages))
    doc = {"python": platform.python_version(), "window": WINDOW, "results": results}
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
