"""Schema migrations with yoyo-migrations, on the store's own connection, for both dialects.

The scripts are ``gateway/store/migrations/NNNN.name.sql`` (one script serves SQLite and
PostgreSQL). yoyo records applied scripts in ``_yoyo_migration`` and serialises concurrent
migrators with its lock table, so several gateways starting at once on one PostgreSQL apply
each script exactly once.

* A database that already has every script applied is only read (a read-only SQLite file
  opens fine).
* A database with a script this gateway does not know is newer than the code: refused,
  untouched.
* A SQLite file from before yoyo (the home-made ``schema_version`` table, version 1) has the
  same tables as script 0001: that script is marked applied, not run again.
"""

from __future__ import annotations

import logging
from importlib.resources import files
from typing import Any

from yoyo import read_migrations
from yoyo.backends.base import DatabaseBackend
from yoyo.backends.core.postgresql import PostgresqlPsycopgBackend
from yoyo.backends.core.sqlite3 import SQLiteBackend
from yoyo.connections import parse_uri
from yoyo.exceptions import LockTimeout
from yoyo.migrations import MigrationList, default_migration_table

from gateway.store.dialect import Connection, Dialect
from gateway.store.errors import StoreError

log = logging.getLogger(__name__)

LEGACY_VERSION = 1  # what the pre-yoyo SQLite schema_version could hold
LOCK_TIMEOUT_S = 30


def scripts() -> MigrationList:
    return read_migrations(str(files("gateway.store") / "migrations"))


def migrate(conn: Connection, dialect: Dialect) -> int:
    """Apply what is missing; returns how many scripts were applied before (0: new database)."""
    migrations = scripts()
    known = {m.hash: m for m in migrations}
    applied = _applied(conn, dialect)
    legacy = _legacy_version(conn) if dialect is Dialect.SQLITE else 0
    unknown = [h for h in applied if h not in known]
    if unknown or legacy > LEGACY_VERSION:
        raise StoreError(
            f"database schema is newer than this gateway ({len(unknown)} unknown migrations, "
            f"legacy version {legacy})"
        )
    found = len(applied) or legacy
    if set(known) <= set(applied):
        return found
    backend = _backend(conn, dialect)
    backend.init_database()
    try:
        _apply(backend, migrations, legacy=legacy, conn=conn, dialect=dialect)
    except LockTimeout as exc:
        raise StoreError(f"schema migration lock: {exc}") from exc
    return found


def _apply(
    backend: DatabaseBackend,
    migrations: MigrationList,
    *,
    legacy: int,
    conn: Connection,
    dialect: Dialect,
) -> None:
    with backend.lock(timeout=LOCK_TIMEOUT_S):
        if legacy and not _applied(conn, dialect):
            backend.mark_migrations(migrations[:LEGACY_VERSION])
            log.info("store: pre-yoyo schema %d adopted", legacy)
        todo = backend.to_apply(migrations)  # again, under the lock: another may have run them
        backend.apply_migrations(todo)
        log.info("store: %d migrations applied", len(todo))


def _applied(conn: Connection, dialect: Dialect) -> list[str]:
    if dialect is Dialect.SQLITE:
        exists = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
            (default_migration_table,),
        ).fetchone()
    else:
        exists = conn.execute("SELECT to_regclass(%s)", (default_migration_table,)).fetchone()
        exists = exists if exists and exists[0] is not None else None
    if not exists:
        return []
    rows = conn.execute(f'SELECT migration_hash FROM "{default_migration_table}"').fetchall()  # noqa: S608  # constant
    return [str(r[0]) for r in rows]


def _legacy_version(conn: Connection) -> int:
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    ).fetchone()
    if row is None:
        return 0
    version = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
    return int(version or 0)


def _backend(conn: Connection, dialect: Dialect) -> DatabaseBackend:
    """A yoyo backend driving ``conn`` (yoyo otherwise opens its own connection)."""
    base: type[Any] = SQLiteBackend if dialect is Dialect.SQLITE else PostgresqlPsycopgBackend

    class _OnConnection(base):  # type: ignore[misc]  # yoyo is untyped
        def connect(self, dburi: object) -> Connection:
            return conn

        def copy(self) -> Any:  # yoyo runs each script on a copy; ours shares the connection
            return self

        def __exit__(self, *exc: object) -> None:  # the store owns (and closes) the connection
            return None

    uri = "sqlite:///:memory:" if dialect is Dialect.SQLITE else "postgresql:///store"
    backend: DatabaseBackend = _OnConnection(parse_uri(uri), default_migration_table)
    return backend
