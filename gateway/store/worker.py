"""The store's one thread and its one database connection (SQLite or PostgreSQL).

A single-thread executor owns the connection: every read and write is a job on it, so they are
serialized and the event loop never touches the disk. The connection is opened (and the schema
migrated) by the first job; a failed open is retried by the next one, and so is a connection
the server dropped (PostgreSQL restart, network): the job that saw it fails, the next reconnects.

Bounds: the writer has at most one batch in flight (the store awaits it). Reads in flight are
capped at ``max_reads``; a read beyond that is refused with :class:`StoreError` (the HTTP API
answers 503) rather than queued without limit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from gateway.store.db import Connector, Database
from gateway.store.errors import StoreError
from gateway.store.records import Record

log = logging.getLogger(__name__)
T = TypeVar("T")
WriteResults = list[StoreError | None]


def closed_errors(count: int) -> WriteResults:
    """The results of ``count`` rows the store closed before writing."""
    return [StoreError("store closed before the write") for _ in range(count)]


class Worker:
    def __init__(self, connector: Connector, *, max_reads: int = 32) -> None:
        self._connector = connector
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        self._db: Database | None = None  # touched only on the executor thread
        self._max_reads = max_reads
        self._reads = 0
        self.closed = False

    async def read(self, fn: Callable[[Database], T]) -> T:
        """Run ``fn`` on the store thread; raises :class:`StoreError`."""
        if self.closed:
            raise StoreError("store closed")
        if self._reads >= self._max_reads:
            raise StoreError(f"store busy: {self._reads} reads in flight")
        self._reads += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._executor, lambda: self._job(fn))
        finally:
            self._reads -= 1

    def start_write(self, records: Sequence[Record]) -> asyncio.Future[WriteResults]:
        """Schedule a batch; the future gives one error (or None) per record, never raises."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._executor, self._write, records)

    async def close(self, timeout_s: float) -> None:
        self.closed = True
        loop = asyncio.get_running_loop()
        closing = loop.run_in_executor(self._executor, self._close)
        await asyncio.wait({closing}, timeout=timeout_s)
        self._executor.shutdown(wait=False)

    # ---- on the store thread ------------------------------------------------------------------

    def _open(self) -> Database:
        if self._db is None:
            self._db = Database.open(self._connector)
            log.info(
                "store open on %s (%d migrations found applied)",
                self._connector.where,
                self._db.found_version,
            )
        return self._db

    def _job(self, fn: Callable[[Database], T]) -> T:
        try:
            return fn(self._open())
        finally:
            self._drop_if_broken()

    def _drop_if_broken(self) -> None:
        if self._db is not None and self._db.broken:
            log.warning("store connection to %s lost; reconnecting", self._connector.where)
            self._close()

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _write(self, records: Sequence[Record]) -> WriteResults:
        """One transaction; if it fails, each record alone so one bad row sinks no other."""
        try:
            db = self._open()
            db.write(records)
        except Exception as exc:  # a failed write must never kill the writer
            self._drop_if_broken()
            if len(records) == 1 or self._db is None:
                return [_as_store_error(exc)] * len(records)
            return [self._write_one(db, record) for record in records]
        return [None] * len(records)

    @staticmethod
    def _write_one(db: Database, record: Record) -> StoreError | None:
        try:
            db.write([record])
        except Exception as exc:  # counted by the store, never raised
            return _as_store_error(exc)
        return None


def _as_store_error(exc: Exception) -> StoreError:
    return exc if isinstance(exc, StoreError) else StoreError(f"write failed: {exc!r}")
