"""SQLite schema, its migrations, and the upsert statements (the SQL twin of ``records.py``).

The schema version lives in ``schema_version`` (one row). Migrations are applied in order at
open, each in its own transaction; a database newer than this code is refused, not touched.
Columns are nullable except keys so that a partial update can never fail on a missing value.
"""

from __future__ import annotations

import sqlite3

from gateway.store.errors import StoreError

MIGRATIONS: tuple[str, ...] = (
    # 1: instances and steps
    """
    CREATE TABLE instances (
        id TEXT PRIMARY KEY NOT NULL,
        device TEXT,
        app_id TEXT,
        task_id TEXT,
        lesson_id TEXT,
        mode TEXT,
        priority INTEGER,
        source TEXT,
        state TEXT CHECK (state IN ('running', 'paused', 'completed', 'cancelled')),
        reason TEXT,
        created_ms INTEGER,
        updated_ms INTEGER,
        ended_ms INTEGER,
        current_step INTEGER,
        resume TEXT
    );
    CREATE INDEX instances_created ON instances (created_ms DESC, id DESC);
    CREATE INDEX instances_device ON instances (device, created_ms DESC);
    CREATE INDEX instances_state ON instances (state, created_ms DESC);
    CREATE TABLE steps (
        instance_id TEXT NOT NULL,
        step_index INTEGER NOT NULL,
        clip TEXT,
        prompt_text TEXT,
        expected_text TEXT,
        asr_text TEXT,
        metrics TEXT NOT NULL DEFAULT '[]',
        assessed_at INTEGER,
        played_ms INTEGER,
        completed_ms INTEGER,
        duration_ms INTEGER,
        window_ms INTEGER,
        window_opened_ms INTEGER,
        window_planned_close_ms INTEGER,
        window_closed_ms INTEGER,
        failure TEXT,
        PRIMARY KEY (instance_id, step_index)
    );
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)

INSTANCE_COLUMNS = (
    "id",
    "device",
    "app_id",
    "task_id",
    "lesson_id",
    "mode",
    "priority",
    "source",
    "state",
    "reason",
    "created_ms",
    "updated_ms",
    "ended_ms",
    "current_step",
    "resume",
)
STEP_COLUMNS = (
    "instance_id",
    "step_index",
    "clip",
    "prompt_text",
    "expected_text",
    "asr_text",
    "metrics",
    "assessed_at",
    "played_ms",
    "completed_ms",
    "duration_ms",
    "window_ms",
    "window_opened_ms",
    "window_planned_close_ms",
    "window_closed_ms",
    "failure",
)


def _set_clause(table: str, columns: tuple[str, ...], special: dict[str, str]) -> str:
    """``col = COALESCE(excluded.col, table.col)`` for every column, unless ``special``."""
    return ",\n    ".join(
        f"{c} = {special.get(c, f'COALESCE(excluded.{c}, {table}.{c})')}" for c in columns
    )


_INSTANCE_SET = _set_clause(
    "instances",
    INSTANCE_COLUMNS[1:],
    {
        "created_ms": "COALESCE(instances.created_ms, excluded.created_ms)",
        "reason": "CASE WHEN excluded.state IS NOT NULL THEN excluded.reason "
        "ELSE COALESCE(excluded.reason, instances.reason) END",
    },
)
_STEP_SET = _set_clause(
    "steps",
    STEP_COLUMNS[2:],
    {"metrics": "CASE WHEN excluded.metrics = '[]' THEN steps.metrics ELSE excluded.metrics END"},
)

# Column names are constants of this module; values are always bound parameters.
UPSERT_INSTANCE = (
    f"INSERT INTO instances ({', '.join(INSTANCE_COLUMNS)}) "  # noqa: S608  # constants only
    f"VALUES ({', '.join('?' for _ in INSTANCE_COLUMNS)}) "
    f"ON CONFLICT (id) DO UPDATE SET\n    {_INSTANCE_SET}"
)
UPSERT_STEP = (
    f"INSERT INTO steps ({', '.join(STEP_COLUMNS)}) "  # noqa: S608  # constants only
    f"VALUES ({', '.join('?' for _ in STEP_COLUMNS)}) "
    f"ON CONFLICT (instance_id, step_index) DO UPDATE SET\n    {_STEP_SET}"
)


def current_version(conn: sqlite3.Connection) -> int:
    row = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    ).fetchone()
    if row is None:
        return 0
    version = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
    return int(version or 0)


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the schema to :data:`SCHEMA_VERSION`; returns the version found before."""
    found = current_version(conn)
    if found > SCHEMA_VERSION:
        raise StoreError(f"database schema {found} is newer than this gateway ({SCHEMA_VERSION})")
    for version in range(found + 1, SCHEMA_VERSION + 1):
        script = MIGRATIONS[version - 1]
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            for statement in _statements(script):
                conn.execute(statement)
            conn.execute("DELETE FROM schema_version")
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    return found


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]
