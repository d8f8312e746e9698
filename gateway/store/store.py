"""The async store: SQLite on one dedicated thread, fed by a bounded coalescing write queue.

Everything touching SQLite runs on a single-thread executor that owns the one connection, so
reads and writes are serialized and the event loop never blocks on the disk.

* ``submit_instance`` / ``submit_step`` (the hot path's variant) enqueue and return at once;
  they never raise. A failed write is logged, counted (``store_write_failures``) and raises the
  ops alarm ``store_failed`` (at most one per ``alarm_interval_s``).
* ``upsert_instance`` / ``upsert_step`` go through the same queue (so ordering with submits
  holds) and wait for the commit; they raise :class:`StoreError` on failure.
* The writer takes up to ``batch_size`` pending rows per transaction; if the transaction fails
  each row is retried alone so one bad row cannot sink the others.
* Queue overflow: see :mod:`gateway.store.pending` (coalesce by key; oldest row dropped only
  when ``queue_limit`` distinct rows are pending).
* After a row commits, listeners (the manager reporter) are told its instance id, on the loop.
* Shutdown (cancellation of ``run``) writes what is pending within ``close_timeout_s``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from gateway.metrics import Metrics
from gateway.store.alarms import AlarmFn, RateLimitedAlarm, no_alarm
from gateway.store.db import ConnectionFactory, Database, Record, file_connection
from gateway.store.errors import StoreError
from gateway.store.pending import CoalescingQueue, Entry
from gateway.store.records import InstanceRecord, InstanceState, StepRecord

if TYPE_CHECKING:
    from gateway.service import Context

log = logging.getLogger(__name__)
T = TypeVar("T")
Listener = Callable[[str], None]


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Store:
    name = "store"

    def __init__(
        self,
        *,
        path: Path | None = None,
        connect: ConnectionFactory | None = None,
        queue_limit: int = 10_000,
        batch_size: int = 256,
        close_timeout_s: float = 2.0,
        alarm_interval_s: float = 60.0,
        clock_ms: Callable[[], int] = wall_ms,
    ) -> None:
        if connect is None:
            if path is None:
                raise ValueError("Store needs a path or a connect factory")
            connect = file_connection(path)
        self._connect = connect
        self._queue = CoalescingQueue(queue_limit)
        self._batch_size = batch_size
        self._close_timeout_s = close_timeout_s
        self._alarm_interval_s = alarm_interval_s
        self._clock_ms = clock_ms
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        self._db: Database | None = None  # touched only on the executor thread
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._inflight: tuple[list[Entry], asyncio.Future[list[StoreError | None]]] | None = None
        self._listeners: list[Listener] = []
        self._closed = False
        self._failing = False
        self.bind(metrics=Metrics(), alarm=no_alarm)

    # ---- wiring -------------------------------------------------------------------------------

    def bind(self, *, metrics: Metrics, alarm: AlarmFn) -> None:
        """Declare figures on ``metrics`` and raise alarms through ``alarm`` (before ``run``)."""
        self._writes = metrics.counter("store_writes", "Rows written to the store", ["table"])
        self._failures = metrics.counter("store_write_failures", "Rows whose write failed")
        self._depth = metrics.gauge("store_queue_depth", "Rows waiting to be written")
        self._coalesced = metrics.counter("store_coalesced", "Updates merged into a pending row")
        self._dropped = metrics.counter("store_dropped", "Pending rows dropped (queue overflow)")
        self._alarm_failed = RateLimitedAlarm(
            "store_failed", alarm, interval_s=self._alarm_interval_s
        )
        self._alarm_overflow = RateLimitedAlarm(
            "store_overflow", alarm, interval_s=self._alarm_interval_s
        )

    def attach(self, ctx: Context) -> None:
        self.bind(metrics=ctx.metrics, alarm=ctx.ops.alarm)
        ctx.http.add_health("store", self.health)

    def add_listener(self, listener: Listener) -> None:
        """``listener(instance_id)`` is called on the loop after a row of it commits."""
        self._listeners.append(listener)

    def health(self) -> dict[str, object]:
        return {"ok": not self._failing, "pending": len(self._queue)}

    # ---- writes -------------------------------------------------------------------------------

    def submit_instance(self, record: InstanceRecord) -> None:
        """Fire and forget; never blocks, never raises."""
        self._put(self._stamp(record), None)

    def submit_step(self, record: StepRecord) -> None:
        """Fire and forget; never blocks, never raises."""
        self._put(record, None)

    async def upsert_instance(self, record: InstanceRecord) -> None:
        await self._put_and_wait(self._stamp(record))

    async def upsert_step(self, record: StepRecord) -> None:
        await self._put_and_wait(record)

    async def flush(self) -> None:
        """Wait until everything submitted so far has been written (or has failed)."""
        await self._idle.wait()

    # ---- reads (raise StoreError) -------------------------------------------------------------

    async def get_instance(
        self, instance_id: str
    ) -> tuple[InstanceRecord, list[StepRecord]] | None:
        return await self._call(lambda db: db.get_instance(instance_id))

    async def list_instances(
        self,
        *,
        device_id: str | None = None,
        state: InstanceState | None = None,
        limit: int = 50,
    ) -> list[InstanceRecord]:
        """Newest first."""
        return await self._call(
            lambda db: db.list_instances(device_id=device_id, state=state, limit=limit)
        )

    async def running_instances(self) -> list[InstanceRecord]:
        """Instances left ``running`` or ``paused`` (restart-resume), oldest first."""
        return await self._call(lambda db: db.unfinished_instances())

    # ---- the writer ---------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._call(lambda db: None)  # open + migrate now, not at the first write
        except StoreError as exc:
            self._record_failure(exc, rows=0)
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                while len(self._queue):
                    await self._write_batch(self._queue.take(self._batch_size))
                self._idle.set()
        finally:
            await self._shutdown()

    async def _write_batch(self, entries: list[Entry]) -> None:
        self._depth.set(len(self._queue))
        loop = asyncio.get_running_loop()
        records = [e.record for e in entries]
        fut = loop.run_in_executor(self._executor, self._write_in_thread, records)
        self._inflight = (entries, fut)
        results = await asyncio.shield(fut)  # a cancelled writer still sees its batch finish
        self._inflight = None
        self._finish(entries, results)

    def _write_in_thread(self, records: Sequence[Record]) -> list[StoreError | None]:
        """Runs on the store thread; returns one error (or None) per record, never raises."""
        try:
            db = self._open_in_thread()
            db.write(records)
        except Exception as exc:  # a failed write must never kill the writer
            error = exc if isinstance(exc, StoreError) else StoreError(f"write failed: {exc!r}")
            if len(records) == 1 or self._db is None:
                return [error] * len(records)
            return [self._write_one(db, record) for record in records]
        return [None] * len(records)

    @staticmethod
    def _write_one(db: Database, record: Record) -> StoreError | None:
        try:
            db.write([record])
        except Exception as exc:  # counted by the caller, never raised
            return exc if isinstance(exc, StoreError) else StoreError(f"write failed: {exc!r}")
        return None

    def _finish(self, entries: list[Entry], results: list[StoreError | None]) -> None:
        changed: dict[str, None] = {}
        for entry, error in zip(entries, results, strict=True):
            table = "instances" if isinstance(entry.record, InstanceRecord) else "steps"
            if error is None:
                self._writes.labels(table).inc()
                changed[entry.record.instance_id] = None
                self._failing = False
            else:
                self._record_failure(error, rows=1, key=entry.record.instance_id)
            _settle(entry, error)
        for instance_id in changed:
            for listener in self._listeners:
                try:
                    listener(instance_id)
                except Exception:
                    log.exception("store listener failed for instance %s", instance_id)

    def _record_failure(self, exc: StoreError, *, rows: int, key: str | None = None) -> None:
        self._failing = True
        self._failures.inc(rows)
        log.warning("store write failed (instance %s): %s", key, exc)
        self._alarm_failed(error=str(exc), instance_id=key)

    async def _shutdown(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._close_timeout_s
        if self._inflight is not None:
            entries, fut = self._inflight
            await asyncio.wait({fut}, timeout=max(0.0, deadline - loop.time()))
            self._finish(entries, fut.result() if fut.done() else _closed_errors(entries))
            self._inflight = None
        while len(self._queue) and loop.time() < deadline:
            entries = self._queue.take(self._batch_size)
            fut = loop.run_in_executor(
                self._executor, self._write_in_thread, [e.record for e in entries]
            )
            await asyncio.wait({fut}, timeout=max(0.0, deadline - loop.time()))
            self._finish(entries, fut.result() if fut.done() else _closed_errors(entries))
        self._closed = True
        left = self._queue.take(len(self._queue))
        if left:
            log.warning("store closed with %d rows unwritten", len(left))
            self._finish(left, _closed_errors(left))
        closing = loop.run_in_executor(self._executor, self._close_in_thread)
        await asyncio.wait({closing}, timeout=max(0.0, deadline - loop.time()))
        self._executor.shutdown(wait=False)
        self._depth.set(0)
        self._idle.set()

    # ---- helpers ------------------------------------------------------------------------------

    def _stamp(self, record: InstanceRecord) -> InstanceRecord:
        if record.updated_ms is not None and record.created_ms is not None:
            return record
        now = self._clock_ms()
        return replace(
            record,
            created_ms=now if record.created_ms is None else record.created_ms,
            updated_ms=now if record.updated_ms is None else record.updated_ms,
        )

    def _put(self, record: Record, waiter: asyncio.Future[None] | None) -> None:
        if self._closed:
            error = StoreError("store closed", key=record.instance_id)
            if waiter is not None:
                waiter.set_exception(error)
            else:
                self._record_failure(error, rows=1, key=record.instance_id)
            return
        result = self._queue.put(record, waiter)
        if result.coalesced:
            self._coalesced.inc()
        if result.dropped is not None:
            self._dropped.inc()
            self._alarm_overflow(limit=self._queue.limit)
            _settle(result.dropped, StoreError("dropped: write queue full"))
        self._depth.set(len(self._queue))
        self._idle.clear()
        self._wakeup.set()

    async def _put_and_wait(self, record: Record) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._put(record, waiter)
        await waiter

    async def _call(self, fn: Callable[[Database], T]) -> T:
        if self._closed:
            raise StoreError("store closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(self._open_in_thread()))

    def _open_in_thread(self) -> Database:
        if self._db is None:
            self._db = Database.open(self._connect)
            log.info("store open (schema found at version %d)", self._db.found_version)
        return self._db

    def _close_in_thread(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


def _closed_errors(entries: list[Entry]) -> list[StoreError | None]:
    return [StoreError("store closed before the write") for _ in entries]


def _settle(entry: Entry, error: StoreError | None) -> None:
    for waiter in entry.waiters:
        if waiter.done():
            continue
        if error is None:
            waiter.set_result(None)
        else:
            waiter.set_exception(error)
