"""The columns and the upsert statements (the SQL twin of ``records.py``).

The tables are created by the migration scripts (``migrations/*.sql``, applied by
``migrations.py``). The upserts are standard ``INSERT … ON CONFLICT … DO UPDATE`` with
``excluded``, which SQLite (3.24+) and PostgreSQL (9.5+) both read the same way; they are
written with ``?`` placeholders (see :meth:`Dialect.sql`).
"""

from __future__ import annotations

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
    "audio_id",
    "assessment_shed",
    "response_latency_ms",  # migration 0005: behaviour signals (STEPS tasks)
    "step_completed",
)
AUDIO_COLUMNS = (
    "id",
    "device",
    "instance_id",
    "step_index",
    "created_ms",
    "size_bytes",
    "duration_ms",
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
