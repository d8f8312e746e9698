"""Xiaozhi device worker process: many simulated devices, each its own MQTT connection.

``python -m bench.load.devices SPEC.json`` (started by the harness). Devices are the project's
:class:`gateway.simulators.xiaozhi.XiaozhiDeviceSim` (firmware hello, firmware reply checks),
given the broker account the OTA endpoint would have handed out (provisioned in bulk by the
harness). After ``go T0`` on stdin each device sends the firmware's hello at its scheduled
times (seconds after T0) and notes publish → reply received (monotonic clock). Phases:
``staggered`` (hellos spread evenly over a span: steady load with every session open) then
``burst`` (every device at the same instant). Prints one JSON document and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.load.procs import die_with_parent, hold_gc
from gateway.simulators.xiaozhi import MqttInfo, XiaozhiDeviceSim, hello_json

CONNECT_TIMEOUT_S = 120.0
REPLY_TIMEOUT_S = 10.0


class TimedDevice(XiaozhiDeviceSim):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reply_at: float | None = None
        self.replied = asyncio.Event()

    def _on_json(self, payload: bytes) -> None:
        if b'"hello"' in payload and self.reply_at is None:
            self.reply_at = time.monotonic()
            self.replied.set()
        super()._on_json(payload)


async def hello(device: TimedDevice, body: bytes) -> float | None:
    """One hello → reply round trip in ms (None: no reply within the timeout)."""
    device.reply_at = None
    device.replied.clear()
    t0 = time.monotonic()
    await device.publish(body)
    try:
        async with asyncio.timeout(REPLY_TIMEOUT_S):
            await device.replied.wait()
    except TimeoutError:
        return None
    assert device.reply_at is not None
    return (device.reply_at - t0) * 1000


async def phase(
    devices: list[TimedDevice], schedule: list[list[float]], t0: float
) -> dict[str, Any]:
    body = hello_json()
    samples: list[float] = []
    lost = 0

    async def one(device: TimedDevice, times: list[float]) -> None:
        nonlocal lost
        for at in times:
            delay = t0 + at - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            ms = await hello(device, body)
            if ms is None:
                lost += 1
            else:
                samples.append(ms)

    async with asyncio.TaskGroup() as tg:
        for device, times in zip(devices, schedule, strict=True):
            tg.create_task(one(device, times), name=f"load.hello[{device.mac}]")
    return {"latency_ms": samples, "no_reply": lost}


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    devices = []
    for dev, password in spec["devices"].items():
        device = TimedDevice(mac=dev.replace("_", ":"), board="load")
        device.mqtt_info = MqttInfo(
            endpoint=f"{spec['host']}:{spec['port']}",
            client_id=f"GID_load@@@{dev}@@@{uuid.uuid4()}",
            username=dev,
            password=password,
            publish_topic=f"device-server/{dev}",
            subscribe_topic=f"devices/p2p/{dev}",
        )
        devices.append(device)
    async with contextlib.AsyncExitStack() as stack:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            for device in devices:
                await stack.enter_async_context(device)
        sys.stdout.write(json.dumps({"ready": len(devices)}) + "\n")
        sys.stdout.flush()
        results: dict[str, Any] = {}
        for name in ("staggered", "burst"):
            line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            hold_gc()  # from here on it measures
            t0 = float(line.split()[1])
            cpu0 = time.process_time()
            results[name] = await phase(devices, spec["schedules"][name], t0)
            results[name]["cpu_s"] = time.process_time() - cpu0
            sys.stdout.write(json.dumps({"phase_done": name}) + "\n")
            sys.stdout.flush()
        # Report, then exit without tearing down hundreds of clients (see boards.py).
        sys.stdout.write(json.dumps(results) + "\n")
        sys.stdout.flush()
        os._exit(0)
    return results


def main() -> int:
    die_with_parent()
    spec = json.loads(Path(sys.argv[1]).read_text())
    asyncio.run(run(spec))  # exits the process itself once it has reported
    return 1


if __name__ == "__main__":
    sys.exit(main())
