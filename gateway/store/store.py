"""The async store: SQLite or PostgreSQL on one dedicated thread, fed by a bounded coalescing
write queue.

Everything touching the database runs on a single-thread executor that owns the one connection, so
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
* :meth:`after_committed` runs a callback once every row submitted so far has been written (or
  has failed): scale-out sends a board command only once the step it starts is in the shared
  store, so a gateway taking over never replays a step the board already moved past.
* Shutdown (cancellation of ``run``) writes what is pending within ``close_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from gateway.metrics import Metrics
from gateway.store.alarms import AlarmFn, RateLimitedAlarm, no_alarm
from gateway.store.db import Connector, Database, file_connection
from gateway.store.errors import StoreError
from gateway.store.pending import CoalescingQueue, Entry
from gateway.store.records import ArchivedAudio, InstanceRecord, Record, StepRecord
from gateway.store.worker import Worker, WriteResults, closed_errors
from gateway.tasks.core.effects import InstanceState

log = logging.getLogger(__name__)
CommitListener = Callable[[str], None]
T = TypeVar("T")


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Store:
    name = "store"

    def __init__(
        self,
        *,
        path: Path | None = None,
        connect: Connector | None = None,
        queue_limit: int = 10_000,
        max_reads: int = 32,
        batch_size: int = 256,
        linger_s: float = 0.02,
        close_timeout_s: float = 2.0,
        alarm_interval_s: float = 60.0,
        clock_ms: Callable[[], int] = wall_ms,
        metrics: Metrics | None = None,  # default: a registry of its own (tests, tools)
        alarm: AlarmFn = no_alarm,
    ) -> None:
        """``metrics`` gets the store's figures and ``alarm`` its rate-limited ops alarms."""
        if connect is None:
            if path is None:
                raise ValueError("Store needs a path or a connect factory")
            connect = file_connection(path)
        self._worker = Worker(connect, max_reads=max_reads)
        # Bounded: ``queue_limit`` distinct rows; overflow coalesces by key, and only a new key
        # beyond the limit drops the oldest pending row (counted, alarmed). See pending.py.
        self._queue = CoalescingQueue(queue_limit)
        self._batch_size = batch_size
        # After a wake-up the writer waits this long for more rows (unless a batch is full):
        # one executor round trip and one transaction per ~20 ms instead of per row, and the
        # several updates of one step coalesce into one write. Rows are side-path data; the hot
        # path never waits for them. Except in a cluster, where a board command waits for the
        # rows before it (``after_committed``): a waiter ends the linger (``_hurry``), or every
        # command would leave a linger late (a tiny 2-gateway run: next-clip p50 25 ms).
        self._linger_s = linger_s
        self._hurry = asyncio.Event()
        self._close_timeout_s = close_timeout_s
        self._alarm_interval_s = alarm_interval_s
        self._clock_ms = clock_ms
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._inflight: tuple[list[Entry], asyncio.Future[WriteResults]] | None = None
        self._listeners: list[CommitListener] = []
        self._seq = 0  # submits so far; rows carry the number of their first update
        # (submit number, callback), in submit order; released as rows commit. Bounded by the
        # callers (one per board command in flight), never by the store.
        self._after: deque[tuple[int, Callable[[], None]]] = deque()
        self._failing = False
        metrics = metrics or Metrics()
        self._writes = metrics.counter("store_writes", "Rows written to the store", ["table"])
        self._failures = metrics.counter("store_write_failures", "Rows whose write failed")
        self._depth = metrics.gauge("store_queue_depth", "Rows waiting to be written")
        self._depth.set_function(lambda: len(self._queue))  # read when scraped, not per row
        self._coalesced = metrics.counter("store_coalesced", "Updates merged into a pending row")
        self._dropped = metrics.counter("store_dropped", "Pending rows dropped (queue overflow)")
        self._alarm_failed = RateLimitedAlarm(
            "store_failed", alarm, interval_s=self._alarm_interval_s
        )
        self._alarm_overflow = RateLimitedAlarm(
            "store_overflow", alarm, interval_s=self._alarm_interval_s
        )

    def add_listener(self, listener: CommitListener) -> None:
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

    def after_committed(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the loop) once every row submitted before now has been
        written or has failed; at once if that is already so. Callbacks run in call order."""
        if not self._after and self._committed_upto() >= self._seq:
            callback()
        else:
            self._after.append((self._seq, callback))
            self._hurry.set()  # someone waits: write what is pending now, no linger

    async def committed(self) -> None:
        """Wait until every row submitted before now is written (or failed); unlike
        :meth:`flush` it does not wait for rows submitted meanwhile."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.after_committed(lambda: None if done.done() else done.set_result(None))
        await done

    def _committed_upto(self) -> int:
        """Every submit numbered up to this is written (or failed): a pending or in-flight row
        holds updates numbered from its ``first_seq`` on, and rows leave in that order."""
        if self._inflight is not None and self._inflight[0]:
            return self._inflight[0][0].first_seq - 1
        oldest = self._queue.oldest_seq()
        return self._seq if oldest is None else oldest - 1

    def _release_after(self) -> None:
        upto = self._committed_upto()
        while self._after and self._after[0][0] <= upto:
            _, callback = self._after.popleft()
            try:
                callback()
            except Exception:
                log.exception("store after_committed callback failed")

    async def flush(self) -> None:
        """Wait until everything submitted so far has been written (or has failed)."""
        await self._idle.wait()

    # ---- reads (raise StoreError) -------------------------------------------------------------

    async def get_instance(
        self, instance_id: str
    ) -> tuple[InstanceRecord, list[StepRecord]] | None:
        return await self._worker.read(lambda db: db.get_instance(instance_id))

    async def list_instances(
        self,
        *,
        device_id: str | None = None,
        state: InstanceState | None = None,
        limit: int = 50,
    ) -> list[InstanceRecord]:
        """Newest first."""
        return await self._worker.read(
            lambda db: db.list_instances(device_id=device_id, state=state, limit=limit)
        )

    async def call(self, fn: Callable[[Database], T]) -> T:
        """Run ``fn`` on the store's thread with its connection (the console's account tables:
        :meth:`Database.query` / :meth:`Database.change`); raises :class:`StoreError`."""
        return await self._worker.read(fn)

    async def running_instances(self) -> list[InstanceRecord]:
        """Instances left ``running`` or ``paused`` (restart-resume), oldest first."""
        return await self._worker.read(lambda db: db.unfinished_instances())

    # ---- the audio archive's rows (gateway/archive; raise StoreError) ------------------------

    async def add_audio(self, row: ArchivedAudio) -> None:
        await self._worker.read(lambda db: db.add_audio(row))

    async def audio_by_id(self, audio_id: str) -> ArchivedAudio | None:
        return await self._worker.read(lambda db: db.audio_by_id(audio_id))

    async def audio_of_step(self, instance_id: str, step_index: int) -> ArchivedAudio | None:
        return await self._worker.read(lambda db: db.audio_of_step(instance_id, step_index))

    async def audio_of_device(self, device: str) -> list[ArchivedAudio]:
        return await self._worker.read(lambda db: db.audio_of_device(device))

    async def audio_bytes(self, device: str) -> int:
        return await self._worker.read(lambda db: db.audio_bytes(device))

    async def audio_before(self, cutoff_ms: int, limit: int) -> list[ArchivedAudio]:
        return await self._worker.read(lambda db: db.audio_before(cutoff_ms, limit))

    async def delete_audio(self, audio_ids: Sequence[str]) -> None:
        await self._worker.read(lambda db: db.delete_audio(audio_ids))

    async def forget_device(self, device: str) -> tuple[int, int, int]:
        """Erase the device's instances, steps and audio rows (after pending writes land, so
        a row still queued cannot bring it back). Returns (instances, steps, audio rows)."""
        await self.flush()
        return await self._worker.read(lambda db: db.forget_device(device))

    # ---- the writer ---------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._worker.read(lambda db: None)  # open + migrate now, not at first write
        except StoreError as exc:
            self._record_failure(exc, rows=0)
        try:
            while True:
                await self._wakeup.wait()
                if self._linger_s > 0 and len(self._queue) < self._batch_size:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self._linger_s):
                            await self._hurry.wait()
                self._wakeup.clear()
                while len(self._queue):
                    entries = self._queue.take(self._batch_size)
                    fut = self._worker.start_write([e.record for e in entries])
                    self._inflight = (entries, fut)
                    results = await asyncio.shield(fut)  # a cancelled writer still sees it end
                    self._inflight = None
                    self._finish(entries, results)
                self._hurry.clear()  # every waiter so far was released with what it waited for
                self._idle.set()
        finally:
            await self._shutdown()

    def _finish(self, entries: list[Entry], results: WriteResults) -> None:
        changed: dict[str, None] = {}
        for entry, error in zip(entries, results, strict=True):
            table = "instances" if isinstance(entry.record, InstanceRecord) else "steps"
            if error is None:
                self._writes.labels(table).inc()
                changed[entry.record.instance_id] = None
                self._failing = False
            else:
                self._record_failure(error, rows=1, key=entry.record.instance_id)
            entry.settle(error)
        self._release_after()
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
        """Finish the batch in flight and write what is pending, within ``close_timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._close_timeout_s
        inflight, self._inflight = self._inflight, None
        while True:
            if inflight is None:
                if not len(self._queue) or loop.time() >= deadline:
                    break
                entries = self._queue.take(self._batch_size)
                inflight = (entries, self._worker.start_write([e.record for e in entries]))
            entries, fut = inflight
            await asyncio.wait({fut}, timeout=max(0.0, deadline - loop.time()))
            self._finish(entries, fut.result() if fut.done() else closed_errors(len(entries)))
            inflight = None
        await self._worker.close(timeout_s=max(0.0, deadline - loop.time()))
        left = self._queue.take(len(self._queue))
        if left:
            log.warning("store closed with %d rows unwritten", len(left))
            self._finish(left, closed_errors(len(left)))
        self._after.clear()  # closing: nothing more leaves for the boards
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
        if self._worker.closed:
            error = StoreError("store closed", key=record.instance_id)
            if waiter is not None:
                waiter.set_exception(error)
            else:
                self._record_failure(error, rows=1, key=record.instance_id)
            return
        self._seq += 1
        result = self._queue.put(record, waiter, seq=self._seq)
        if result.coalesced:
            self._coalesced.inc()
        if result.dropped is not None:
            self._dropped.inc()
            self._alarm_overflow(limit=self._queue.limit)
            result.dropped.settle(StoreError("dropped: write queue full"))
        self._idle.clear()
        self._wakeup.set()

    async def _put_and_wait(self, record: Record) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._put(record, waiter)
        await waiter
