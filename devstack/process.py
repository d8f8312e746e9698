"""The dev stack's gateway as a *process* of its own: the one subprocess runner.

:class:`GatewayProcess` starts ``python -m devstack.process SPEC.json`` (the production
composition, :func:`devstack.gateway.running_gateway`, from plain settings sections such as
:func:`devstack.gateway.gateway_sections` builds) with its log in ``ROOT/gateway.log``, and
returns once the child printed its bound ports (broker connected, HTTP, UDP and the task
runtime up). It stops with SIGTERM (the bounded shutdown path, then SIGKILL if it overstays) or
is killed at once with SIGKILL (no shutdown path: the broker publishes its LWT). The load
harness (``bench/load``) and the scale-out tests (``tests/support/cluster.py``) use it.

``listen`` (streaming benchmarks only): device ids whose microphone audio is decoded and run
through the VAD from their first datagram on, as if a listen window were open for each; in
production the task runtime turns that on per window (``XiaozhiChannel.set_listening``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import json
import os
import signal
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from devstack.broker import StackError
from devstack.gateway import REPO_ROOT, running_gateway
from gateway.app import Gateway
from gateway.logs import setup_logging
from gateway.settings import load_settings

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


@dataclass
class GatewayProcess:
    """One gateway process; ``settings`` are plain sections (JSON-able)."""

    root: Path
    settings: dict[str, Any]
    listen: Sequence[str] = ()
    admin_port: int = 0
    udp_port: int = 0
    # The child's module (``python -m MODULE SPEC.json``; a benchmark may wrap :func:`serve`)
    # and what it adds to the spec file.
    module: str = "devstack.process"
    spec_extra: dict[str, Any] = field(default_factory=dict)
    killed_at_ms: int | None = None  # wall clock of a :meth:`kill`
    _proc: asyncio.subprocess.Process | None = field(default=None, repr=False)

    @property
    def gateway_id(self) -> str:
        return str(self.settings["gateway_id"])

    @property
    def log_path(self) -> Path:
        return self.root / "gateway.log"

    @property
    def pid(self) -> int:
        return self._started().pid

    def _started(self) -> asyncio.subprocess.Process:
        if self._proc is None:
            raise StackError("start() first")
        return self._proc

    async def start(self, *, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Spawn the process; returns once it serves (raises, with its log's tail, if it ends
        first)."""
        self.root.mkdir(parents=True, exist_ok=True)
        spec = self.root / "gateway.json"
        spec.write_text(
            json.dumps({"settings": self.settings, "listen": list(self.listen), **self.spec_extra})
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("SNLPGW_")}
        with self.log_path.open("ab") as log:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", self.module, str(spec), env=env, cwd=REPO_ROOT,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=log,
            )  # fmt: skip
        try:
            async with asyncio.timeout(timeout_s):
                ready = await self._ready_line(self._proc.stdout)
        except BaseException:
            await self.kill()
            raise
        self.admin_port, self.udp_port = ready["admin_port"], ready["udp_port"]

    async def _ready_line(self, stdout: asyncio.StreamReader | None) -> dict[str, Any]:
        line = await stdout.readline() if stdout is not None else b""
        if not line:
            raise StackError(f"{self.gateway_id} exited before ready: {self.tail()}")
        ready: dict[str, Any] = json.loads(line)
        return ready

    async def kill(self) -> None:
        """SIGKILL: the process ends at once; the broker writes its LWT."""
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
            await self._proc.wait()
            self.killed_at_ms = time.time_ns() // 1_000_000

    async def stop(self) -> None:
        """SIGTERM (the graceful, bounded shutdown), SIGKILL if it overstays."""
        if self._proc is None or self._proc.returncode is not None:
            return
        self._proc.terminate()
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await self._proc.wait()
        except TimeoutError:
            await self.kill()

    async def wait(self) -> int:
        """Until the process has ended; its exit code."""
        return await self._started().wait()

    def check_alive(self) -> None:
        """Raise (with the log's tail) if the process ended without a :meth:`kill`."""
        code = None if self._proc is None else self._proc.returncode
        if code is not None and self.killed_at_ms is None:
            raise AssertionError(f"{self.gateway_id} exited ({code}): {self.tail()}")

    def tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def metrics(self) -> dict[str, float]:
        """Every sample of GET /metrics as ``name{label=value,...}`` → value (blocking)."""
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
    root: Path,
    settings: dict[str, Any],
    *,
    listen: Sequence[str] = (),
    module: str = "devstack.process",
    spec_extra: dict[str, Any] | None = None,
) -> AsyncIterator[GatewayProcess]:
    """A started :class:`GatewayProcess`, stopped when the block exits."""
    gw = GatewayProcess(root, settings, listen, module=module, spec_extra=spec_extra or {})
    try:
        await gw.start()
        yield gw
    finally:
        await gw.stop()


def die_with_parent() -> None:
    """Linux: SIGTERM this process when the one that started it dies (even if killed), so no
    gateway or harness worker outlives it."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


async def serve(
    spec: dict[str, Any],
    *,
    on_ready: Callable[[asyncio.AbstractEventLoop], None] | None = None,
    on_started: Callable[[Gateway], Awaitable[None]] | None = None,
) -> None:
    """The child's life: the gateway from ``spec``, its ports on stdout once it serves, until
    SIGTERM/SIGINT. ``on_started(gateway)`` (a benchmark's warm-up) is awaited once the
    gateway serves and ``on_ready(loop)`` runs after it, just before the ports are printed."""
    settings = load_settings(**spec["settings"])
    setup_logging(settings.ops.log_level, json_lines=settings.ops.log_json)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with running_gateway(settings) as gw:
        for dev in spec.get("listen", []):
            gw.xiaozhi.set_listening(dev, True)
        if on_started is not None:
            await on_started(gw)
        if on_ready is not None:
            on_ready(loop)
        ready = {"admin_port": gw.service.admin.port, "udp_port": gw.xiaozhi.udp_port}
        sys.stdout.write(json.dumps(ready) + "\n")
        sys.stdout.flush()
        await stop.wait()


def main() -> int:
    """The child: ``python -m devstack.process SPEC.json``."""
    die_with_parent()
    asyncio.run(serve(json.loads(Path(sys.argv[1]).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
