"""Broker + gateway process for one harness phase, and reading the gateway's metrics.

The broker is the dev stack's (:func:`devstack.broker.local_broker`: generated config, password
file and ACL, a free loopback port); the gateway's settings are the dev stack's too
(:func:`devstack.gateway.gateway_sections`, ``Use.LOAD``). The gateway runs in a process of its own
(:mod:`bench.load.gateway_proc`), stopped with SIGTERM (then killed if it overstays) when the
phase ends, so nothing outlives the harness.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from devstack.gateway import REPO_ROOT

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


@dataclass
class GatewayProcess:
    pid: int
    admin_port: int
    udp_port: int

    def metrics(self) -> dict[str, float]:
        """Every sample of GET /metrics as ``name{label=value,...}`` → value."""
        url = f"http://127.0.0.1:{self.admin_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return out


@contextlib.asynccontextmanager
async def gateway_process(
    root: Path, settings: dict[str, Any], *, listen: list[str] | None = None
) -> AsyncIterator[GatewayProcess]:
    spec = root / "gateway.json"
    spec.write_text(json.dumps({"settings": settings, "listen": listen or []}))
    log = (root / "gateway.log").open("ab")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNLPGW_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.load.gateway_proc", str(spec),
        stdout=asyncio.subprocess.PIPE, stderr=log, env=env, cwd=REPO_ROOT,
    )  # fmt: skip
    try:
        assert proc.stdout is not None  # PIPE was requested
        async with asyncio.timeout(READY_TIMEOUT_S):
            line = await proc.stdout.readline()
        if not line:
            raise RuntimeError(f"gateway exited before ready; see {root / 'gateway.log'}")
        ready = json.loads(line)
        yield GatewayProcess(proc.pid, ready["admin_port"], ready["udp_port"])
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        log.close()


class Worker:
    """A harness worker process (boards or devices) driven over stdin/stdout JSON lines."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, module: str, spec: dict[str, Any], path: Path) -> Worker:
        await asyncio.to_thread(path.write_text, json.dumps(spec))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, str(path), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, cwd=REPO_ROOT, limit=64 * 1024 * 1024,
        )  # fmt: skip
        return cls(proc)

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def line(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdout is not None  # PIPE was requested
        async with asyncio.timeout(timeout_s):
            raw = await self.proc.stdout.readline()
        if not raw:
            raise RuntimeError(f"worker {self.pid} exited early ({await self.proc.wait()})")
        out: dict[str, Any] = json.loads(raw)
        return out

    def go(self, t0: float) -> None:
        assert self.proc.stdin is not None  # PIPE was requested
        self.proc.stdin.write(f"go {t0}\n".encode())

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


@contextlib.asynccontextmanager
async def workers(
    module: str, specs: list[dict[str, Any]], root: Path
) -> AsyncIterator[list[Worker]]:
    started: list[Worker] = []
    try:
        for i, spec in enumerate(specs):
            started.append(await Worker.start(module, spec, root / f"{module}-{i}.json"))
        yield started
    finally:
        for worker in started:
            await worker.stop()


def split(items: list[Any], parts: int) -> list[list[Any]]:
    """``items`` dealt round-robin into ``parts`` lists (so each share has every kind of start)."""
    return [items[i::parts] for i in range(parts)]
