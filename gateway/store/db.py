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
    ArchivedAudio,
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

    def device_instances(
        self, device_id: str, *, since_ms: int | None, until_ms: int | None, limit: int
    ) -> list[InstanceRecord]:
        """A device's instances created in ``[since_ms, until_ms)``, newest first."""
        where = ["device = ?"]
        params: list[object] = [device_id]
        if since_ms is not None:
            where.append("created_ms >= ?")
            params.append(since_ms)
        if until_ms is not None:
            where.append("created_ms < ?")
            params.append(until_ms)
        rows = self._read(
            f"SELECT {_INSTANCE_SELECT} FROM instances "  # noqa: S608  # constants
            f"WHERE {' AND '.join(where)} ORDER BY created_ms DESC, id DESC LIMIT ?",
            (*params, limit),
        )
        return [_instance(r) for r in rows]

    def steps_of(self, instance_ids: Sequence[str]) -> list[StepRecord]:
        """The steps of these instances, by instance then step index (chunks of 200 ids)."""
        found: list[StepRecord] = []
        ids = list(dict.fromkeys(instance_ids))
        for start in range(0, len(ids), 200):
            chunk = ids[start : start + 200]
            marks = ", ".join("?" for _ in chunk)
            rows = self._read(
                f"SELECT {_STEP_SELECT} FROM steps "  # noqa: S608  # constants, bound values
                f"WHERE instance_id IN ({marks}) ORDER BY instance_id, step_index",
                chunk,
            )
            found.extend(_step(r) for r in rows)
        return found

    def unfinished_instances(self) -> list[InstanceRecord]:
        rows = self._read(
            f"SELECT {_INSTANCE_SELECT} FROM instances "  # noqa: S608  # constants
            "WHERE state IN ('running', 'paused') ORDER BY created_ms, id",
            (),
        )
        return [_instance(r) for r in rows]

    # ---- the audio archive (gateway/archive) --------------------------------------------------

    def add_audio(self, row: ArchivedAudio) -> None:
        """Record an archived answer (the same blob twice: kept once)."""
        self.change(
            [
                (
                    f"INSERT INTO audio ({_AUDIO_SELECT}) VALUES (?, ?, ?, ?, ?, ?, ?) "  # noqa: S608
                    "ON CONFLICT (id) DO NOTHING",
                    (
                        row.audio_id,
                        row.device,
                        row.instance_id,
                        row.step_index,
                        row.created_ms,
                        row.size_bytes,
                        row.duration_ms,
                    ),
                )
            ]
        )

    def audio_by_id(self, audio_id: str) -> ArchivedAudio | None:
        rows = self._read(f"SELECT {_AUDIO_SELECT} FROM audio WHERE id = ?", (audio_id,))  # noqa: S608
        return _audio(rows[0]) if rows else None

    def audio_of_step(self, instance_id: str, step_index: int) -> ArchivedAudio | None:
        """The newest archived answer of a step."""
        rows = self._read(
            f"SELECT {_AUDIO_SELECT} FROM audio "  # noqa: S608  # constants
            "WHERE instance_id = ? AND step_index = ? ORDER BY created_ms DESC LIMIT 1",
            (instance_id, step_index),
        )
        return _audio(rows[0]) if rows else None

    def audio_of_device(self, device: str) -> list[ArchivedAudio]:
        """Oldest first."""
        rows = self._read(
            f"SELECT {_AUDIO_SELECT} FROM audio WHERE device = ? "  # noqa: S608  # constants
            "ORDER BY created_ms, id",
            (device,),
        )
        return [_audio(r) for r in rows]

    def audio_bytes(self, device: str) -> int:
        """The size of ``device``'s archived answers (the quota check: one indexed sum)."""
        rows = self._read(
            "SELECT COALESCE(SUM(size_bytes), 0) FROM audio WHERE device = ?", (device,)
        )
        return int(str(rows[0][0]))  # PostgreSQL sums BIGINT as numeric (Decimal)

    def audio_before(self, cutoff_ms: int, limit: int) -> list[ArchivedAudio]:
        """Archived before ``cutoff_ms``, oldest first (the retention sweeper's batch)."""
        rows = self._read(
            f"SELECT {_AUDIO_SELECT} FROM audio WHERE created_ms < ? "  # noqa: S608  # constants
            "ORDER BY created_ms, id LIMIT ?",
            (cutoff_ms, limit),
        )
        return [_audio(r) for r in rows]

    def delete_audio(self, audio_ids: Sequence[str]) -> None:
        """Drop the rows of these blobs and the steps' pointers to them."""
        statements: list[tuple[str, tuple[object, ...]]] = []
        for audio_id in audio_ids:
            statements.append(("UPDATE steps SET audio_id = NULL WHERE audio_id = ?", (audio_id,)))
            statements.append(("DELETE FROM audio WHERE id = ?", (audio_id,)))
        self.change(statements)

    def forget_device(self, device: str) -> tuple[int, int, int]:
        """Erase every row of ``device``: its audio rows, its instances' steps (transcripts,
        metrics) and its instances, in one transaction. Returns (instances, steps, audio)."""
        counts = self._read(
            "SELECT (SELECT COUNT(*) FROM instances WHERE device = ?), "
            "(SELECT COUNT(*) FROM steps WHERE instance_id IN "
            "(SELECT id FROM instances WHERE device = ?)), "
            "(SELECT COUNT(*) FROM audio WHERE device = ?)",
            (device, device, device),
        )[0]
        self.change(
            [
                ("DELETE FROM audio WHERE device = ?", (device,)),
                (  # re-assessments (transcripts, metrics) of its steps
                    "DELETE FROM assessments WHERE instance_id IN "
                    "(SELECT id FROM instances WHERE device = ?)",
                    (device,),
                ),
                (
                    "DELETE FROM steps WHERE instance_id IN "
                    "(SELECT id FROM instances WHERE device = ?)",
                    (device,),
                ),
                ("DELETE FROM instances WHERE device = ?", (device,)),
            ]
        )
        return int(counts[0]), int(counts[1]), int(counts[2])  # type: ignore[call-overload]

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[object, ...]]:
        """A read of another component's tables (the console's accounts); ``?`` placeholders;
        raises :class:`StoreError`."""
        return self._read(sql, params)

    def change(self, statements: Sequence[tuple[str, Sequence[object]]]) -> int:
        """Run ``statements`` in one transaction (all or nothing); the rows the last one
        changed. Raises :class:`StoreError`."""
        conn = self._conn
        changed = 0
        try:
            conn.execute("BEGIN IMMEDIATE" if self.dialect is Dialect.SQLITE else "BEGIN")
            try:
                for sql, params in statements:
                    changed = conn.execute(self.dialect.sql(sql), params).rowcount
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except self._write_errors as exc:
            raise StoreError(f"write failed: {exc}") from exc
        return int(changed)

    def _read(self, sql: str, params: Sequence[object]) -> list[tuple[object, ...]]:
        try:
            return list(self._conn.execute(self.dialect.sql(sql), params).fetchall())
        except self._errors as exc:
            raise StoreError(f"read failed: {exc}") from exc


_INSTANCE_SELECT = ", ".join(schema.INSTANCE_COLUMNS)
_STEP_SELECT = ", ".join(schema.STEP_COLUMNS)
_AUDIO_SELECT = ", ".join(schema.AUDIO_COLUMNS)


def _audio(row: tuple[object, ...]) -> ArchivedAudio:
    audio_id, device, instance_id, step_index, created_ms, size_bytes, duration_ms = row
    return ArchivedAudio(
        str(audio_id),
        str(device),
        str(instance_id),
        int(step_index),  # type: ignore[call-overload]
        int(created_ms),  # type: ignore[call-overload]
        int(size_bytes),  # type: ignore[call-overload]
        int(duration_ms),  # type: ignore[call-overload]
    )


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
        r.audio_id,
        r.assessment_shed,
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
