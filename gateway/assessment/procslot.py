"""Worker processes for CPU-bound engines (spawned, one job at a time each).

The loop never touches a pipe directly: each exchange (send job, wait up to the job timeout,
receive) runs in a helper thread. A timeout or a dead worker makes the slot unhealthy; the pool
then kills and reaps it and opens a fresh one. Killing the process also ends the helper thread
(its pipe reaches EOF), so nothing outlives the pool.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from gateway.assessment.engine import EngineUnavailable, SyncEngine
from gateway.assessment.jobs import AnswerGrammar, AsrFailure, AsrJob, AsrResult, FailureReason

EngineFactory = Callable[[], SyncEngine]  # must be picklable (spawn): a class or a partial

_READY = "ready"


def _worker_main(conn: Connection, factory: EngineFactory) -> None:  # pragma: no cover (child)
    try:
        engine = factory()
    except Exception as exc:  # reported to the parent, which backs off
        conn.send(("error", repr(exc)[:300]))
        return
    conn.send((_READY, engine.name))
    while True:
        try:
            msg: tuple[bytes, Sequence[str], AnswerGrammar | None] | None = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        pcm, hints, grammar = msg
        try:
            result: AsrResult | AsrFailure = engine.transcribe(pcm, hints, grammar)
        except Exception as exc:  # the engine's bug becomes a typed failure, worker lives on
            result = AsrFailure(FailureReason.ENGINE_ERROR, repr(exc)[:300])
        conn.send(result)


def _await_reply(conn: Connection, timeout_s: float) -> object:
    """Thread side: the worker's reply, ``TimeoutError`` or ``EOFError`` (worker died)."""
    try:
        if not conn.poll(timeout_s):
            return TimeoutError()
        return conn.recv()
    except (EOFError, OSError) as exc:
        return EOFError(repr(exc))


def _exchange(conn: Connection, job: AsrJob, timeout_s: float) -> object:
    try:
        conn.send((job.pcm, job.hints, job.grammar))
    except (OSError, ValueError) as exc:
        return EOFError(repr(exc))
    return _await_reply(conn, timeout_s)


class ProcessSlot:
    def __init__(self, proc: BaseProcess, conn: Connection, engine: str) -> None:
        self._proc = proc
        self._conn = conn
        self.engine = engine
        self._healthy = True

    @property
    def healthy(self) -> bool:
        return self._healthy and self._proc.is_alive()

    async def run(self, job: AsrJob, timeout_s: float) -> AsrResult | AsrFailure:
        try:
            reply = await asyncio.to_thread(_exchange, self._conn, job, timeout_s)
        except BaseException:
            self._healthy = False  # cancelled mid-job: the worker's state is unknown
            raise
        if isinstance(reply, AsrResult | AsrFailure):
            return reply
        self._healthy = False
        if isinstance(reply, TimeoutError):
            return AsrFailure(FailureReason.TIMEOUT, f"no result within {timeout_s:g} s")
        await asyncio.to_thread(self._proc.join, 2.0)  # EOF comes before the exit is reaped
        code = self._proc.exitcode
        return AsrFailure(FailureReason.WORKER_CRASHED, f"worker exited (code {code})")

    def close(self) -> None:
        """Kill and reap; synchronous so it also runs on cancellation (SIGKILL reaps in ms)."""
        self._healthy = False
        if self._proc.is_alive():
            self._proc.kill()  # stateless worker: nothing to flush
        self._proc.join(5.0)
        self._conn.close()


class ProcessBackend:
    """Spawns one worker process per slot from a picklable engine factory."""

    def __init__(self, factory: EngineFactory, *, name: str, startup_timeout_s: float = 60.0):
        self.name = name
        self._factory = factory
        self._startup_timeout_s = startup_timeout_s
        self._ctx = mp.get_context("spawn")

    async def open_slot(self) -> ProcessSlot:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=_worker_main, args=(child, self._factory), name=f"asr-{self.name}", daemon=True
        )
        await asyncio.to_thread(proc.start)
        child.close()
        slot = ProcessSlot(proc, parent, self.name)
        try:
            reply = await asyncio.to_thread(_await_reply, parent, self._startup_timeout_s)
        except BaseException:
            slot.close()
            raise
        if isinstance(reply, tuple) and reply[0] == _READY:
            return slot
        slot.close()
        raise EngineUnavailable(self.name, f"worker did not start: {reply!r}"[:300])

    async def aclose(self) -> None:
        return None
