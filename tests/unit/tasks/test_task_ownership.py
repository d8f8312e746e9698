"""The task shell under scale-out: it acts only for devices it owns; losing a device stops its
actor at once, gaining one resumes the stored running instance through the restore path."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.metrics import Metrics
from gateway.tasks.core import (
    InstanceColumns,
    StepColumns,
)
from gateway.tasks.core.admission import AdmissionConfig
from gateway.tasks.service import TaskService
from tests.support.fake_mqtt import FakePublisher
from tests.unit.tasks.fakes import FakeAssessment, FakeBoard, FakeMic, FakeRecorder, running_tasks
from tests.unit.tasks.test_task_service import (  # the catalog fixture and request helpers
    DEV,
    _start,
    _task_events,
    fast_catalog,
)

__all__ = ["fast_catalog"]
SHIPPED = AdmissionConfig()
OwnershipRig = tuple[TaskService, FakePublisher, FakeBoard, FakeRecorder, "Owned", Metrics]


@dataclass
class _Wire:
    mqtt: FakePublisher


class Owned:
    def __init__(self) -> None:
        self.devices = {DEV}

    def __call__(self, dev: str) -> bool:
        return dev in self.devices


def _running(recorder: FakeRecorder) -> list[tuple[InstanceColumns, Sequence[StepColumns]]]:
    """What a shared store would hold: the latest snapshot of each instance, if running."""
    latest = {r.instance_id: r for r in recorder.instances}
    out = []
    for inst in latest.values():
        if inst.state in ("running", "paused"):
            steps = {s.step_index: s for s in recorder.steps if s.instance_id == inst.instance_id}
            out.append((inst, [steps[k] for k in sorted(steps)]))
    return out


@contextlib.asynccontextmanager
async def owned(
    fast_catalog: Path, admission: AdmissionConfig = SHIPPED
) -> AsyncIterator[OwnershipRig]:
    """The task service over fakes, acting for the devices in its ``Owned``."""
    metrics, mqtt, owns = Metrics(), FakePublisher(), Owned()
    board, recorder = FakeBoard(clip_ms=300), FakeRecorder()

    async def load_running() -> list[tuple[InstanceColumns, Sequence[StepColumns]]]:
        return _running(recorder)

    async with running_tasks(
        fast_catalog, mqtt, metrics, board, min_window_ms=300, present=[DEV],
        mic=FakeMic(), recorder=recorder, assessment=FakeAssessment(),
        load_running=load_running, owns=owns, handover_delay_s=0.0, admission=admission,
    ) as svc:  # fmt: skip
        yield svc, mqtt, board, recorder, owns, metrics


@pytest.fixture
async def owned_rig(fast_catalog: Path) -> AsyncIterator[OwnershipRig]:
    async with owned(fast_catalog) as rig:
        yield rig


async def test_a_request_for_a_device_owned_elsewhere_is_left_alone(
    owned_rig: OwnershipRig,
) -> None:
    svc, mqtt, board, _, owns, metrics = owned_rig
    owns.devices.clear()
    _start(_Wire(mqtt))  # type: ignore[arg-type]  # the same start request the owner gets
    assert mqtt.bodies("/reply/" + DEV) == []
    assert svc.runtime_of(DEV) is None
    assert board.sent == []
    assert metrics.snapshot()["snlpgw_runtime_not_owner_total"] == 1.0


async def test_handover_stops_the_old_actor_and_resumes_from_the_store(
    owned_rig: OwnershipRig,
) -> None:
    svc, mqtt, board, recorder, owns, _ = owned_rig
    rig = _Wire(mqtt)
    _start(rig)  # type: ignore[arg-type]
    await mqtt.wait_for(lambda: len(board.times_of("PLAY_MEDIA")) >= 2)
    owns.devices.clear()
    svc.on_owners_changed()  # the device is someone else's now
    assert svc.runtime_of(DEV) is None
    sent = len(board.sent)
    played = [p["name"] for _, c, _, p in board.sent if c == "PLAY_MEDIA"]
    owns.devices.add(DEV)
    svc.on_owners_changed()  # ... and ours again: adopted from what the store holds
    await mqtt.wait_for(lambda: bool(_task_events(rig, "instance.completed")), wait_s=10)  # type: ignore[arg-type]
    replayed = [p["name"] for _, c, _, p in board.sent[sent:] if c == "PLAY_MEDIA"]
    assert replayed[0] == played[-1]  # the step in flight is played again, nothing earlier
    assert played[:-1] + replayed == list(dict.fromkeys(played + replayed))  # no other repeat
    assert recorder.instances[-1].state == "completed"


def slow_owned(fast_catalog: Path, rate_per_s: float) -> AbstractAsyncContextManager[OwnershipRig]:
    """The owned rig with one lesson start admitted per ``1 / rate_per_s`` seconds."""
    return owned(fast_catalog, AdmissionConfig(rate_per_s=rate_per_s, burst=1, max_wait_ms=10_000))


async def _until(predicate: Callable[[], bool]) -> None:
    """Wait (bounded) until ``predicate`` holds; for state no publish announces."""
    async with asyncio.timeout(5):
        while not predicate():  # noqa: ASYNC110 - no event announces it
            await asyncio.sleep(0.001)


def _start_of(dev: str, rid: str) -> dict[str, object]:
    return {"v": 1, "id": rid, "action": "start", "priority": 2, "app_id": "english_learning",
            "task_id": "shadowing", "lesson_id": "unit01"}  # fmt: skip


async def test_a_start_waiting_when_its_device_moves_is_refused_so_the_backend_retries(
    fast_catalog: Path,
) -> None:
    async with slow_owned(fast_catalog, rate_per_s=0.2) as (svc, mqtt, _, _, owns, metrics):
        other = "aa_bb_cc_dd_ee_77"
        owns.devices.add(other)
        svc.on_presence(other, True)
        mqtt.deliver(f"snlpgw/v1/ctl/{DEV}", _start_of(DEV, "first"))  # the burst: at once
        mqtt.deliver(f"snlpgw/v1/ctl/{other}", _start_of(other, "waits"))  # its slot: 5 s on
        await _until(lambda: other in svc._starts)
        owns.devices.discard(other)
        svc.on_owners_changed()
        (reply,) = mqtt.bodies("/reply/" + other)
        assert (reply["ref"], reply["status"], reply["reason"]) == (
            "waits",
            "refused",
            "overloaded",
        )
        assert "another gateway" in reply["detail"]
        assert other not in svc._starts
        assert mqtt.bodies("/reply/" + DEV)[0]["status"] == "accepted"
        assert metrics.snapshot()["snlpgw_runtime_not_owner_total"] == 0


async def test_a_start_waiting_for_its_slot_preempts_the_stored_lesson_resumed_meanwhile(
    fast_catalog: Path,
) -> None:
    async with slow_owned(fast_catalog, rate_per_s=1) as (svc, mqtt, board, _, owns, _):
        mqtt.deliver(f"snlpgw/v1/ctl/{DEV}", _start_of(DEV, "old"))  # the burst: at once
        await mqtt.wait_for(lambda: len(board.times_of("PLAY_MEDIA")) >= 1)
        old = mqtt.bodies("/reply/" + DEV)[0]["instance_id"]
        owns.devices.clear()
        svc.on_owners_changed()  # away, with the lesson running in the store ...
        owns.devices.add(DEV)
        mqtt.deliver(f"snlpgw/v1/ctl/{DEV}", _start_of(DEV, "fresh"))  # ... back: waits 1 s
        await _until(lambda: DEV in svc._starts)
        svc.on_owners_changed()  # the stored lesson is resumed while the start waits ...
        rig = _Wire(mqtt)
        await mqtt.wait_for(lambda: bool(_task_events(rig, "instance.restored")))  # type: ignore[arg-type]
        await mqtt.wait_for(lambda: len(mqtt.bodies("/reply/" + DEV)) == 2)
        fresh = mqtt.bodies("/reply/" + DEV)[1]  # ... and the start, at its slot, replaces it
        assert (fresh["ref"], fresh["status"]) == ("fresh", "accepted")
        cancelled = _task_events(rig, "instance.cancelled")  # type: ignore[arg-type]
        assert [(e["instance_id"], e["data"]["reason"]) for e in cancelled] == [(old, "preempted")]
        runtime = svc.runtime_of(DEV)
        assert runtime is not None
        assert runtime.instance is not None
        assert runtime.instance.id == fresh["instance_id"]
