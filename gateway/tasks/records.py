"""The boundary between the runtime's records and the store's partial-update records.

The runtime emits full snapshots of what it owns; the store merges partial updates (SPEC §5
upsert rule). Start parameters travel in the store's opaque ``resume`` JSON so a restarted
gateway can rebuild the instance.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import TypeVar

from gateway import store as st
from gateway.tasks import core as rt

log = logging.getLogger(__name__)
T = TypeVar("T")


def to_store_instance(r: rt.InstanceColumns) -> st.InstanceRecord:
    return st.InstanceRecord(
        instance_id=r.instance_id,
        device_id=r.device_id,
        app_id=r.app_id,
        task_id=r.task_id,
        lesson_id=r.lesson_id,
        mode=r.mode,
        priority=r.priority,
        source=r.source,
        state=r.state,
        reason=r.reason,
        created_ms=r.created_ms,
        ended_ms=r.ended_ms,
        resume=json.dumps(dict(r.params), separators=(",", ":"), default=str),
    )


def to_store_step(r: rt.StepColumns) -> st.StepRecord:
    window_ms = None
    if r.window_opened_ms is not None and r.window_planned_close_ms is not None:
        window_ms = r.window_planned_close_ms - r.window_opened_ms
    return st.StepRecord(
        instance_id=r.instance_id,
        step_index=r.step_index,
        clip=r.prompt_text.rsplit("/", 1)[-1] if r.prompt_text else None,
        prompt_text=r.prompt_text,
        expected_text=r.expected_text,
        played_ms=r.played_ms,
        completed_ms=r.completed_ms,
        duration_ms=r.duration_ms,
        window_ms=window_ms,
        window_opened_ms=r.window_opened_ms,
        window_planned_close_ms=r.window_planned_close_ms,
        window_closed_ms=r.window_closed_ms,
        failure=r.failure,
    )


def from_store(
    inst: st.InstanceRecord, steps: Sequence[st.StepRecord]
) -> tuple[rt.InstanceColumns, list[rt.StepColumns]] | None:
    """A stored instance as the runtime's record, or None when a required field is missing."""
    try:
        params = json.loads(inst.resume or "{}")
        record = rt.InstanceColumns(
            instance_id=inst.instance_id,
            device_id=_req(inst.device_id),
            app_id=_req(inst.app_id),
            task_id=_req(inst.task_id),
            lesson_id=_req(inst.lesson_id),
            mode=_req(inst.mode),
            priority=_req(inst.priority),
            source=inst.source or "mqtt",
            state=_req(inst.state),
            reason=inst.reason,
            created_ms=_req(inst.created_ms),
            ended_ms=inst.ended_ms,
            params=params if isinstance(params, dict) else {},
        )
    except (ValueError, TypeError) as exc:
        log.warning("stored instance %s cannot be restored: %s", inst.instance_id, exc)
        return None
    return record, [
        rt.StepColumns(
            instance_id=s.instance_id,
            step_index=s.step_index,
            prompt_text=s.prompt_text,
            expected_text=s.expected_text,
            played_ms=s.played_ms,
            completed_ms=s.completed_ms,
            duration_ms=s.duration_ms,
            window_opened_ms=s.window_opened_ms,
            window_planned_close_ms=s.window_planned_close_ms,
            window_closed_ms=s.window_closed_ms,
            failure=s.failure,
        )
        for s in steps
    ]


def _req(value: T | None) -> T:
    if value is None:
        raise ValueError("missing field")
    return value


class StoreRecorder:
    """The runtime's :class:`~gateway.tasks.ports.Recorder` on the store (fire-and-forget)."""

    def __init__(self, store: st.Store) -> None:
        self._store = store

    def save_instance(self, record: rt.InstanceColumns) -> None:
        self._store.submit_instance(to_store_instance(record))

    def save_step(self, record: rt.StepColumns) -> None:
        self._store.submit_step(to_store_step(record))

    async def load_running(self) -> list[tuple[rt.InstanceColumns, list[rt.StepColumns]]]:
        # Our own latest writes first: an instance that just ended here must not read as
        # running (a handover adopts what the store says is running).
        await self._store.committed()
        out = []
        for inst in await self._store.running_instances():
            found = await self._store.get_instance(inst.instance_id)
            if found is None:
                continue
            restored = from_store(found[0], found[1])
            if restored is not None:
                out.append(restored)
        return out
