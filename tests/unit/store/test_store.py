"""The async store over a real SQLite file and a real PostgreSQL: coalescing, ordering, failure
handling, shutdown (tests taking ``connector`` run on both, see conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from functools import reduce
from pathlib import Path

import pytest

from gateway.metrics import Metrics
from gateway.store import InstanceRecord, InstanceState, StepRecord, Store, StoredMetric
from gateway.store.db import Connector, Database, file_connection
from gateway.store.dialect import postgres_connection, sqlite_connector
from gateway.store.errors import StoreError
from gateway.store.records import merge_instance, merge_step
from tests.support.postgres import Postgres
from tests.unit.store.helpers import make_context, read_only, sample


@contextlib.asynccontextmanager
async def running(store: Store) -> AsyncIterator[Store]:
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(store.run(), name="test.store")
        try:
            yield store
        finally:
            task.cancel()


def m(value: float) -> tuple[StoredMetric, ...]:
    return (StoredMetric("text_similarity_v0", value),)


async def test_burst_of_submits_coalesces_and_lands_in_final_state(connector: Connector) -> None:
    metrics = Metrics()
    store = Store(connect=connector, clock_ms=lambda: 1000, metrics=metrics)
    sent_i: dict[str, list[InstanceRecord]] = {}
    sent_s: dict[tuple[str, int], list[StepRecord]] = {}
    async with running(store):
        # one synchronous burst: the writer cannot run in between, so every repeat coalesces
        for n in range(400):
            iid = f"inst-{n % 4}"
            inst = InstanceRecord(iid, current_step=n, state=InstanceState.RUNNING)
            step = StepRecord(
                iid,
                n % 3,
                asr_text=f"t{n}" if n % 2 else None,
                metrics=m(n / 400) if n % 5 == 0 else (),
            )
            store.submit_instance(inst)
            store.submit_step(step)
            sent_i.setdefault(iid, []).append(inst)
            sent_s.setdefault((iid, n % 3), []).append(step)
        assert sample(metrics, "store_queue_depth") == 4 + 12
        await store.flush()
        for iid, updates in sent_i.items():
            found = await store.get_instance(iid)
            assert found is not None
            instance, steps = found
            expected = reduce(merge_instance, updates)
            assert instance == InstanceRecord(
                iid,
                state=InstanceState.RUNNING,
                current_step=expected.current_step,
                created_ms=1000,
                updated_ms=1000,
            )
            assert steps == [reduce(merge_step, sent_s[(iid, k)]) for k in range(3)]
    assert sample(metrics, "store_coalesced_total") == 800 - 16
    assert sample(metrics, "store_writes_total", table="steps") == 12
    assert sample(metrics, "store_write_failures_total") == 0


async def test_interleaved_writers_end_in_the_merged_state(connector: Connector) -> None:
    store = Store(connect=connector)
    async with running(store):

        async def writer(k: int) -> None:
            for n in range(50):
                store.submit_step(StepRecord("i", n % 5, asr_text=f"w{k}-{n}", metrics=m(n)))
                await asyncio.sleep(0)

        async with asyncio.TaskGroup() as tg:
            for k in range(4):
                tg.create_task(writer(k), name=f"test.writer{k}")
        store.submit_step(StepRecord("i", 0, asr_text="last"))  # empty metrics: kept
        await store.upsert_instance(InstanceRecord("i", state=InstanceState.COMPLETED))
        await store.flush()
        found = await store.get_instance("i")
    assert found is not None
    steps = found[1]
    assert [s.step_index for s in steps] == [0, 1, 2, 3, 4]
    assert steps[0].asr_text == "last"
    assert steps[0].metrics == m(45)  # the last non-empty one (n = 45 is the last n % 5 == 0)
    assert found[0].state is InstanceState.COMPLETED


async def test_the_loop_is_never_the_database_thread(connector: Connector) -> None:
    seen: list[str] = []

    def spy() -> object:
        seen.append(threading.current_thread().name)
        return connector.connect()

    store = Store(connect=replace(connector, connect=spy))
    async with running(store):
        await store.upsert_step(StepRecord("i", 0))
    assert seen
    assert all(name.startswith("store") for name in seen)
    assert threading.current_thread().name not in seen


async def test_failing_writes_are_counted_never_raised_to_submitters(tmp_path: Path) -> None:
    path = tmp_path / "g.sqlite3"
    Database.open(file_connection(path)).close()  # a valid, current schema
    ctx = make_context(tmp_path)
    store = Store(
        connect=sqlite_connector(lambda: read_only(path)), metrics=ctx.metrics, alarm=ctx.ops.alarm
    )
    metrics = ctx.metrics
    async with running(store):
        for n in range(10):
            store.submit_instance(InstanceRecord(f"i{n}", state=InstanceState.RUNNING))
            store.submit_step(StepRecord(f"i{n}", 0, asr_text="x"))
        await store.flush()
        with pytest.raises(StoreError, match="readonly"):
            await store.upsert_step(StepRecord("i0", 1))
        assert store.health()["ok"] is False
        assert await store.list_instances() == []  # reads still work
    assert sample(metrics, "store_write_failures_total") == 21
    assert sample(metrics, "store_writes_total", table="instances") == 0
    assert sample(metrics, "ops_alarms_total", alarm="store_failed") == 1  # rate-limited


async def test_one_bad_row_does_not_sink_its_batch(connector: Connector) -> None:
    metrics = Metrics()
    store = Store(connect=connector, metrics=metrics)
    async with running(store):
        store.submit_instance(InstanceRecord("good-1"))
        store.submit_instance(InstanceRecord("bad", state="bogus"))  # type: ignore[arg-type]
        store.submit_instance(InstanceRecord("good-2"))
        await store.flush()
        listed = {r.instance_id for r in await store.list_instances()}
    assert listed == {"good-1", "good-2"}
    assert sample(metrics, "store_write_failures_total") == 1
    assert sample(metrics, "store_writes_total", table="instances") == 2


def _read_instance(
    connector: Connector, instance_id: str
) -> tuple[InstanceRecord, list[StepRecord]] | None:
    """The instance as another connection reads it (what is committed), or None."""
    db = Database.open(connector)
    try:
        return db.get_instance(instance_id)
    finally:
        db.close()


async def test_pending_rows_are_written_at_shutdown_and_closed_store_refuses(
    connector: Connector,
) -> None:
    metrics = Metrics()
    store = Store(connect=connector, metrics=metrics)
    async with running(store):
        await store.upsert_instance(InstanceRecord("late", state=InstanceState.RUNNING))
        store.submit_instance(InstanceRecord("late", state=InstanceState.CANCELLED))
    # run() was cancelled right after the submit: the row was still written
    found = _read_instance(connector, "late")
    assert found is not None
    assert found[0].state is InstanceState.CANCELLED
    store.submit_step(StepRecord("late", 0))  # counted, not raised
    assert sample(metrics, "store_write_failures_total") == 1
    with pytest.raises(StoreError, match="closed"):
        await store.upsert_step(StepRecord("late", 0))
    with pytest.raises(StoreError, match="closed"):
        await store.get_instance("late")


async def test_listeners_hear_committed_instances_once_per_batch(connector: Connector) -> None:
    heard: list[str] = []
    store = Store(connect=connector)
    store.add_listener(heard.append)

    def broken(_: str) -> None:
        raise RuntimeError("listener bug")

    store.add_listener(broken)  # logged, does not stop the writer
    async with running(store):
        store.submit_instance(InstanceRecord("a"))
        store.submit_step(StepRecord("a", 0))
        store.submit_step(StepRecord("b", 0))
        await store.flush()
        await store.upsert_instance(InstanceRecord("a", state=InstanceState.COMPLETED))
    assert heard == ["a", "b", "a"]


async def test_overflow_drops_oldest_row_counted(connector: Connector) -> None:
    metrics = Metrics()
    alarms: list[str] = []
    store = Store(
        connect=connector,
        queue_limit=3,
        metrics=metrics,
        alarm=lambda name, **_: alarms.append(name),
    )
    async with running(store):
        for n in range(5):
            store.submit_instance(InstanceRecord(f"i{n}"))
        await store.flush()
        listed = sorted(r.instance_id for r in await store.list_instances())
    assert listed == ["i2", "i3", "i4"]
    assert sample(metrics, "store_dropped_total") == 2
    assert alarms == ["store_overflow"]


def test_store_needs_somewhere_to_write() -> None:
    with pytest.raises(ValueError, match="path"):
        Store()


async def test_a_locked_database_fails_writes_then_recovers(tmp_path: Path) -> None:
    path = tmp_path / "g.sqlite3"
    Database.open(file_connection(path)).close()

    def impatient() -> sqlite3.Connection:
        return sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=0.05)

    metrics = Metrics()
    store = Store(connect=sqlite_connector(impatient), metrics=metrics)
    other = sqlite3.connect(path, isolation_level=None)  # another process holding the write lock
    other.execute("BEGIN IMMEDIATE")
    async with running(store):
        with pytest.raises(StoreError, match="locked"):
            await store.upsert_instance(InstanceRecord("i", state=InstanceState.RUNNING))
        assert store.health()["ok"] is False
        other.execute("ROLLBACK")
        await store.upsert_instance(InstanceRecord("i", state=InstanceState.RUNNING))
        assert store.health()["ok"] is True
        found = await store.get_instance("i")
    other.close()
    assert found is not None
    assert sample(metrics, "store_write_failures_total") == 1
    assert sample(metrics, "store_writes_total", table="instances") == 1


async def test_reads_beyond_the_cap_are_refused(connector: Connector) -> None:
    store = Store(connect=connector, max_reads=0)
    async with running(store):
        with pytest.raises(StoreError, match="busy"):
            await store.list_instances()


@pytest.mark.integration
async def test_a_dropped_postgres_connection_is_reopened(postgres: Postgres) -> None:
    """The server ends the store's session (restart, failover): that write fails, counted; the
    next one reconnects and lands."""
    import psycopg  # noqa: PLC0415

    metrics = Metrics()
    url = postgres.new_database()
    store = Store(connect=postgres_connection(url), metrics=metrics)
    async with running(store):
        await store.upsert_instance(InstanceRecord("before", state=InstanceState.RUNNING))
        with psycopg.connect(postgres.admin_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (url.rsplit("/", 1)[1],),
            )
        with pytest.raises(StoreError):
            await store.upsert_instance(InstanceRecord("lost", state=InstanceState.RUNNING))
        await store.upsert_instance(InstanceRecord("after", state=InstanceState.RUNNING))
        listed = {r.instance_id for r in await store.list_instances()}
    assert {"before", "after"} <= listed
    assert sample(metrics, "store_write_failures_total") == 1


async def test_after_committed_waits_for_every_earlier_row_in_order(connector: Connector) -> None:
    """What a callback sees in the database (read on another connection) when it runs."""
    store = Store(connect=connector)
    seen: list[tuple[str, object]] = []

    def probe(name: str) -> Callable[[], None]:
        def call() -> None:
            found = _read_instance(connector, "a")
            seen.append((name, found and ([s.played_ms for s in found[1]], found[0].current_step)))

        return call

    async with running(store):
        store.after_committed(probe("idle"))  # nothing submitted: at once
        assert seen == [("idle", None)]
        store.submit_instance(InstanceRecord("a", state=InstanceState.RUNNING))
        store.after_committed(probe("after-a"))
        store.submit_step(StepRecord("a", 0, played_ms=1))
        store.submit_instance(InstanceRecord("a", current_step=0))  # merged into a's row
        store.after_committed(probe("after-step"))
        assert len(seen) == 1  # nothing written yet
        await store.committed()  # released after the callbacks before it
    assert seen[1:] == [("after-a", ([1], 0)), ("after-step", ([1], 0))]


async def test_a_waiting_command_cuts_the_writers_linger_short(connector: Connector) -> None:
    """Rows wait up to ``linger_s`` to be written in one batch, unless something waits for them
    (``after_committed``: a board command in a cluster). A minute's linger makes the difference
    plain: without a waiter the row is still pending, with one it is written at once."""
    store = Store(connect=connector, linger_s=60.0)

    def stored() -> bool:
        return _read_instance(connector, "a") is not None

    async with running(store):
        store.submit_instance(InstanceRecord("a", state=InstanceState.RUNNING))
        await asyncio.sleep(0.2)  # the writer is lingering now
        assert not stored()
        released = asyncio.Event()
        store.after_committed(released.set)
        await asyncio.wait_for(released.wait(), timeout=30)
        assert stored()
        # The next row, with nobody waiting, lingers again.
        store.submit_instance(InstanceRecord("b", state=InstanceState.RUNNING))
        await asyncio.sleep(0.2)
        assert store.health()["pending"] == 1
