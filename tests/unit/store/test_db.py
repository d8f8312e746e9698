"""Database layer on SQLite and PostgreSQL: migrations (yoyo), the SQL upsert rules, queries.

The SQL upsert and the in-memory merge must agree: a hypothesis test applies random partial
updates one by one to the database and compares with their coalesced merge written once.
Tests taking ``db``/``connector`` run on both backends (see conftest.py).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from functools import reduce
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.store.db import Connector, Database, file_connection
from gateway.store.dialect import Dialect, postgres_connection, sqlite_connector
from gateway.store.errors import StoreError
from gateway.store.migrations import scripts
from gateway.store.records import (
    InstanceRecord,
    InstanceState,
    StepRecord,
    StoredMetric,
    merge_instance,
    merge_step,
)
from tests.support.postgres import Postgres
from tests.unit.store.helpers import read_only

M1 = (StoredMetric("text_similarity_v0", 0.25),)
M2 = (StoredMetric("text_similarity_v0", 1.0), StoredMetric("other_v0", 3.0))


@pytest.fixture
def db(connector: Connector) -> Iterator[Database]:
    database = Database.open(connector)
    yield database
    database.close()


def _tables(db: Database) -> set[str]:
    if db.dialect is Dialect.SQLITE:
        sql = "SELECT name FROM sqlite_master WHERE type = 'table'"
    else:
        sql = "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
    return {str(r[0]) for r in db._read(sql, ())}


def test_schema_created_by_the_migrations_once(connector: Connector) -> None:
    first = Database.open(connector)
    assert first.found_version == 0
    assert {"instances", "steps", "_yoyo_migration"} <= _tables(first)
    first.close()
    again = Database.open(connector)  # reopening migrates nothing
    assert again.found_version == len(scripts())
    applied = again._read("SELECT migration_id FROM _yoyo_migration", ())
    assert applied == [(m.id,) for m in scripts()]
    again.close()


def test_sqlite_file_is_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "g.sqlite3"
    Database.open(file_connection(path)).close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_unknown_migration_means_a_newer_schema_refused_untouched(connector: Connector) -> None:
    db = Database.open(connector)
    db._read(  # a script a newer gateway applied
        "INSERT INTO _yoyo_migration (migration_hash, migration_id, applied_at_utc) "
        "VALUES ('f00d', '0099.from-the-future', '2030-01-01 00:00:00') RETURNING 1",
        (),
    )
    db.close()
    with pytest.raises(StoreError, match="newer"):
        Database.open(connector)


def _legacy_file(path: Path, version: int) -> None:
    """A store written by the gateway before yoyo: same tables, a ``schema_version`` row."""
    script = scripts()[0].path
    conn = sqlite3.connect(path)
    conn.executescript(Path(script).read_text(encoding="utf-8"))
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
    conn.execute("INSERT INTO instances (id, created_ms) VALUES ('old', 7)")
    conn.commit()
    conn.close()


def test_pre_yoyo_sqlite_store_is_adopted_with_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "g.sqlite3"
    _legacy_file(path, 1)
    db = Database.open(file_connection(path))
    assert db.found_version == 1
    found = db.get_instance("old")
    assert found is not None
    assert found[0].created_ms == 7
    db.close()
    again = Database.open(file_connection(path))
    assert again.found_version == len(scripts())
    again.close()


def test_pre_yoyo_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "g.sqlite3"
    _legacy_file(path, 99)
    with pytest.raises(StoreError, match="newer"):
        Database.open(file_connection(path))


@pytest.mark.integration
def test_gateways_starting_together_migrate_once(postgres: Postgres) -> None:
    """Several gateways opening one fresh PostgreSQL at once: yoyo's lock lets one migrate."""
    url = postgres.new_database()
    opened: list[Database] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def open_one() -> None:
        start.wait()
        try:
            opened.append(Database.open(postgres_connection(url)))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_one, name=f"test.gw{n}") for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(db.found_version for db in opened).count(0) >= 1
    for db in opened:
        db.write([InstanceRecord(f"i{id(db)}", created_ms=1)])
    applied = opened[0]._read("SELECT migration_id FROM _yoyo_migration", ())
    assert applied == [(m.id,) for m in scripts()]
    assert len(opened[0].list_instances(device_id=None, state=None, limit=10)) == 4
    for db in opened:
        db.close()


STEP_CASES = [
    # (first write, update, expected metrics, expected asr_text)
    (StepRecord("i", 0, metrics=M1, asr_text="a"), StepRecord("i", 0), M1, "a"),
    (StepRecord("i", 0, metrics=M1), StepRecord("i", 0, metrics=(), asr_text="b"), M1, "b"),
    (StepRecord("i", 0, metrics=M1), StepRecord("i", 0, metrics=M2), M2, None),
    (StepRecord("i", 0), StepRecord("i", 0, metrics=M2, asr_text="c"), M2, "c"),
    (StepRecord("i", 0), StepRecord("i", 0), (), None),
]


@pytest.mark.parametrize(("first", "update", "metrics", "asr"), STEP_CASES)
def test_step_upsert_rule(
    db: Database,
    first: StepRecord,
    update: StepRecord,
    metrics: tuple[StoredMetric, ...],
    asr: str | None,
) -> None:
    db.write([first])
    db.write([update])
    found = db.get_instance("i")
    assert found is None  # steps alone make no instance
    db.write([InstanceRecord("i", created_ms=1)])
    found = db.get_instance("i")
    assert found is not None
    (step,) = found[1]
    assert (step.metrics, step.asr_text) == (metrics, asr)


def test_step_none_fields_keep_stored_values(db: Database) -> None:
    db.write([InstanceRecord("i", created_ms=1)])
    db.write([StepRecord("i", 1, prompt_text="/app/t/lessons/u/01.mp3", played_ms=5)])
    db.write([StepRecord("i", 1, expected_text="Good morning.", window_closed_ms=9)])
    found = db.get_instance("i")
    assert found is not None
    assert found[1] == [
        StepRecord(
            "i",
            1,
            prompt_text="/app/t/lessons/u/01.mp3",
            expected_text="Good morning.",
            played_ms=5,
            window_closed_ms=9,
        )
    ]


def test_behaviour_signals_columns_of_migration_0005(db: Database) -> None:
    """A STEPS task's step: its numbers and behaviour signals, in both dialects."""
    db.write([InstanceRecord("i", created_ms=1)])
    signals = StepRecord(
        "i",
        0,
        asr_text="it is seven",
        metrics=(StoredMetric("task.correct", 1.0),),
        response_latency_ms=640,
        step_completed=1,
    )
    silent = StepRecord("i", 1, response_latency_ms=None, step_completed=0)
    db.write([signals, silent])
    db.write([StepRecord("i", 0, assessed_at=5)])  # a later partial update keeps them
    found = db.get_instance("i")
    assert found is not None
    first, second = found[1]
    assert (first.response_latency_ms, first.step_completed) == (640, 1)
    assert first.metrics == (StoredMetric("task.correct", 1.0),)
    assert (second.response_latency_ms, second.step_completed) == (None, 0)


def test_a_bad_row_fails_the_transaction_alone(db: Database) -> None:
    bad = InstanceRecord("x", state="bogus")  # type: ignore[arg-type]
    with pytest.raises(StoreError):
        db.write([InstanceRecord("ok", created_ms=1), bad])
    assert db.get_instance("ok") is None  # rolled back as a whole


def test_list_filters_newest_first_and_limit(db: Database) -> None:
    for n in range(6):
        state = InstanceState.RUNNING if n % 2 else InstanceState.COMPLETED
        db.write([InstanceRecord(f"i{n}", device_id=f"d{n % 3}", state=state, created_ms=n)])
    ids = [r.instance_id for r in db.list_instances(device_id=None, state=None, limit=50)]
    assert ids == ["i5", "i4", "i3", "i2", "i1", "i0"]
    assert [r.instance_id for r in db.list_instances(device_id="d1", state=None, limit=50)] == [
        "i4",
        "i1",
    ]
    assert [
        r.instance_id
        for r in db.list_instances(device_id=None, state=InstanceState.RUNNING, limit=2)
    ] == ["i5", "i3"]
    db.write([InstanceRecord("i1", state=InstanceState.PAUSED, reason="offline")])
    assert [r.instance_id for r in db.unfinished_instances()] == ["i1", "i3", "i5"]


def test_writes_fail_on_a_read_only_database(tmp_path: Path) -> None:
    path = tmp_path / "g.sqlite3"
    Database.open(file_connection(path)).close()
    ro = Database.open(sqlite_connector(lambda: read_only(path)))
    with pytest.raises(StoreError, match="readonly"):
        ro.write([InstanceRecord("i", created_ms=1)])
    assert ro.list_instances(device_id=None, state=None, limit=5) == []
    ro.close()


# ---- SQL upsert == in-memory merge --------------------------------------------------------

_text = st.one_of(st.none(), st.sampled_from(["a", "b", "offline", "preempted"]))
_int = st.one_of(st.none(), st.integers(0, 10))
_instances = st.builds(
    InstanceRecord,
    instance_id=st.just("i"),
    device_id=_text,
    priority=_int,
    state=st.one_of(st.none(), st.sampled_from(list(InstanceState))),
    reason=_text,
    created_ms=st.integers(0, 10),  # the store always stamps these
    updated_ms=st.integers(0, 10),
    ended_ms=_int,
    current_step=_int,
    resume=_text,
)
_steps = st.builds(
    StepRecord,
    instance_id=st.just("i"),
    step_index=st.just(0),
    asr_text=_text,
    expected_text=_text,
    metrics=st.sampled_from([(), M1, M2]),
    assessed_at=_int,
    window_closed_ms=_int,
    failure=_text,
    assessment_shed=_text,
)


def _check_upsert_matches_merge(
    one_by_one: Database,
    coalesced: Database,
    *,
    base_i: InstanceRecord,
    updates_i: list[InstanceRecord],
    base_s: StepRecord,
    updates_s: list[StepRecord],
) -> None:
    for db in (one_by_one, coalesced):
        db.write([base_i, base_s])
    for record in [*updates_i, *updates_s]:
        one_by_one.write([record])
    coalesced.write([reduce(merge_instance, updates_i), reduce(merge_step, updates_s)])
    a, b = one_by_one.get_instance("i"), coalesced.get_instance("i")
    assert a == b
    assert a is not None
    assert a[0] == reduce(merge_instance, updates_i, base_i)
    assert a[1] == [reduce(merge_step, updates_s, base_s)]


def _memory() -> Database:
    return Database.open(sqlite_connector(lambda: sqlite3.connect(":memory:")))


@settings(max_examples=150, deadline=None)
@given(
    base_i=_instances,
    updates_i=st.lists(_instances, min_size=1, max_size=6),
    base_s=_steps,
    updates_s=st.lists(_steps, min_size=1, max_size=6),
)
def test_sql_upsert_matches_the_merge_rules(
    base_i: InstanceRecord,
    updates_i: list[InstanceRecord],
    base_s: StepRecord,
    updates_s: list[StepRecord],
) -> None:
    one_by_one, coalesced = _memory(), _memory()
    _check_upsert_matches_merge(
        one_by_one,
        coalesced,
        base_i=base_i,
        updates_i=updates_i,
        base_s=base_s,
        updates_s=updates_s,
    )
    one_by_one.close()
    coalesced.close()


@pytest.fixture(scope="module")
def pg_pair(postgres: Postgres) -> Iterator[tuple[Database, Database]]:
    pair = (
        Database.open(postgres_connection(postgres.new_database())),
        Database.open(postgres_connection(postgres.new_database())),
    )
    yield pair
    for db in pair:
        db.close()


@pytest.mark.integration
@settings(max_examples=60, deadline=None)
@given(
    base_i=_instances,
    updates_i=st.lists(_instances, min_size=1, max_size=6),
    base_s=_steps,
    updates_s=st.lists(_steps, min_size=1, max_size=6),
)
def test_postgres_upsert_matches_the_merge_rules(
    pg_pair: tuple[Database, Database],
    base_i: InstanceRecord,
    updates_i: list[InstanceRecord],
    base_s: StepRecord,
    updates_s: list[StepRecord],
) -> None:
    for db in pg_pair:
        db._read("DELETE FROM steps RETURNING 1", ())
        db._read("DELETE FROM instances RETURNING 1", ())
    _check_upsert_matches_merge(
        *pg_pair, base_i=base_i, updates_i=updates_i, base_s=base_s, updates_s=updates_s
    )
