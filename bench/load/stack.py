"""The harness's worker processes (boards or devices), driven over stdin/stdout JSON lines.

The broker, the gateway's settings and the gateway process are the dev stack's
(:func:`devstack.broker.local_broker`, :func:`devstack.gateway.gateway_sections` with
``Use.LOAD``, :func:`devstack.process.gateway_process`): stopped when the phase ends, so nothing
outlives the harness.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from devstack.gateway import REPO_ROOT


class LoadWorker:
    """A harness worker process (boards or devices) driven over stdin/stdout JSON lines."""

    def __init__(self, proc: asyncio.subprocess.Process, stderr: Path) -> None:
        self.proc = proc
        self.stderr = stderr  # the worker's own log: its traceback if it dies

    @classmethod
    async def start(cls, module: str, spec: dict[str, Any], path: Path) -> LoadWorker:
        await asyncio.to_thread(path.write_text, json.dumps(spec))
        stderr = path.with_suffix(".err")
        with stderr.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", module, str(path), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=err, cwd=REPO_ROOT,
                limit=64 * 1024 * 1024,
            )  # fmt: skip
        return cls(proc, stderr)

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def line(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdout is not None  # PIPE was requested
        async with asyncio.timeout(timeout_s):
            raw = await self.proc.stdout.readline()
        if not raw:
            code = await self.proc.wait()
            tail = self.stderr.read_text(errors="replace")[-1500:] if self.stderr.exists() else ""
            raise RuntimeError(f"worker {self.pid} exited early ({code}): {tail}")
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
) -> AsyncIterator[list[LoadWorker]]:
    started: list[LoadWorker] = []
    try:
        for i, spec in enumerate(specs):
            started.append(await LoadWorker.start(module, spec, root / f"{module}-{i}.json"))
        yield started
    finally:
        for worker in started:
            await worker.stop()


def split(items: list[Any], parts: int) -> list[list[Any]]:
    """``items`` dealt round-robin into ``parts`` lists (so each share has every kind of start)."""
    return [items[i::parts] for i in range(parts)]
