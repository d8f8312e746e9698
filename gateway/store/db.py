"""Synchronous database access on one connection. Only ever called from the store's own thread.

The same code serves SQLite and PostgreSQL (see ``dialect.py``); the schema comes from the
migration scripts (``migrations.py``). A :class:`Connector` is injectable: tests open a real
read-only SQLite database to make writes fail for real.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.store import schema
from gateway.store.dialect import Connection, Connector, Dialect, file_connection
from gateway.store.errors import StoreError
from gateway.store.migrations import migrate
from gateway.store.records import (
    InstanceRecord,
    Record,
    StepRecord,
    metrics_from_text,
    metrics_to_text,
)
from gateway.tasks.core.effects import InstanceState

__all__ = ["Connector", "Database", "file_connection"]


class Database:
    def __init__(self, conn: Connection, dialect: Dialect) -> None:
        self._conn = conn
        self.dialect = dialect
        self._errors = dialect.errors
        self._write_errors: tuple[type[Exception], ...] = (*dialect.errors, ValueError)
        self._upsert_instance = dialect.sql(schema.UPSERT_INSTANCE)
        self._upsert_step = dialect.sql(schema.UPSERT_STEP)
        self.found_version = migrate(conn, dialect)

    @classmethod
    def open(cls, connector: Connector) -> Database:
        errors = connector.dialect.errors
        try:
            conn = connector.connect()
        except errors as exc:
            raise StoreError(f"cannot open store {connector.where}: {exc}") from exc
        try:
            if connector.dialect is Dialect.SQLITE:
                conn.isolation_level = None  # explicit transactions only
            return cls(conn, connector.dialect)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, errors):
                raise StoreError(f"cannot open store {connector.where}: {exc}") from exc
            raise

    def close(self) -> None:
        self._conn.close()

    @property
    def broken(self) -> bool:
        """The server went away (PostgreSQL): the next job should open a new connection."""
        return bool(getattr(self._conn, "broken", False) or getattr(self._conn, "closed", False))

    def write(self, records: Sequence[Record]) -> None:
        """Upsert ``records`` in one transaction (all or nothing)."""
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE" if self.dialect is Dialect.SQLITE else "BEGIN")
            try:
                for record in records:
                    if isinstance(record, InstanceRecord):
                        conn.execute(self._upsert_instance, _instance_params(record))
                    else:
                        conn.execute(self._upsert_step, _step_params(record))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except self._write_errors as exc:
            raise StoreError(f"write failed: {exc}") from exc

    def get_instance(self, instance_id: str) -> tuple[InstanceRecord, list[StepRecord]] | None:
        row = self._read(
            f"SELECT {_INSTANCE_SELECT} FROM instances WHERE id = ?",  # noqa: S608  # constants
            (instance_id,),
        )
        if not row:
            return None
        steps = self._read(
            f"SELECT {_STEP_SELECT} FROM steps WHERE instance_id = ? "  # noqa: S608  # constants
            "ORDER BY step_index",
            (instance_id,),
        )
        return _instance(row[0]), [_step(r) for r in steps]

    def list_instances(
        self, *, device_id: str | None, state: InstanceState | None, limit: int
    ) -> list[InstanceRecord]:
        where, params = [], []
        if device_id is not None:
            where.append("device = ?")
            params.append(device_id)
        if state is not None:
            where.append("state = ?")
            params.append(state.value)
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        rows = self._read(
            f"SELECT {_INSTANCE_SELECT} FROM instances {clause}"  # noqa: S608  # constants
            "ORDER BY created_ms DESC, id DESC LIMIT ?",
            (*params, limit),
        )
        return [_instance(r) for r in rows]

    def unfinished_instances(self) -> list[InstanceRecord]:
        rows = self._read(
            f"SELECT {_INSTANCE_SELECT} FROM instances "  # noqa: S608  # constants
            "WHERE state IN ('running', 'paused') ORDER BY created_ms, id",
            (),
        )
        return [_instance(r) for r in rows]

    def _read(self, sql: str, params: Sequence[object]) -> list[tuple[object, ...]]:
        try:
            return list(self._conn.execute(self.dialect.sql(sql), params).fetchall())
        except self._errors as exc:
            raise StoreError(f"read failed: {exc}") from exc


_INSTANCE_SELECT = ", ".join(schema.INSTANCE_COLUMNS)
_STEP_SELECT = ", ".join(schema.STEP_COLUMNS)


def _instance_params(r: InstanceRecord) -> tuple[object, ...]:
    state = None if r.state is None else InstanceState(r.state).value
    return (
        r.instance_id,
        r.device_id,
        r.app_id,
        r.task_id,
        r.lesson_id,
        r.mode,
        r.priority,
        r.source,
        state,
        r.reason,
        r.created_ms,
        r.updated_ms,
        r.ended_ms,
        r.current_step,
        r.resume,
    )


def _step_params(r: StepRecord) -> tuple[object, ...]:
    return (
        r.instance_id,
        r.step_index,
        r.clip,
        r.prompt_text,
        r.expected_text,
        r.asr_text,
        metrics_to_text(r.metrics),
        r.assessed_at,
        r.played_ms,
        r.completed_ms,
        r.duration_ms,
        r.window_ms,
        r.window_opened_ms,
        r.window_planned_close_ms,
        r.window_closed_ms,
        r.failure,
        r.response_latency_ms,
        r.step_completed,
    )


def _instance(row: tuple[object, ...]) -> InstanceRecord:
    values = dict(zip(schema.INSTANCE_COLUMNS, row, strict=True))
    state = values.pop("state")
    values["instance_id"] = values.pop("id")
    values["device_id"] = values.pop("device")
    return InstanceRecord(
        **values,  # type: ignore[arg-type]  # columns map 1:1 onto record fields
        state=None if state is None else InstanceState(str(state)),
    )


def _step(row: tuple[object, ...]) -> StepRecord:
    values = dict(zip(schema.STEP_COLUMNS, row, strict=True))
    values["metrics"] = metrics_from_text(values["metrics"])  # type: ignore[arg-type]
    return StepRecord(**values)  # type: ignore[arg-type]  # columns map 1:1 onto record fields
