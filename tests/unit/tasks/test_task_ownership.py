"""The task shell under scale-out: it acts only for devices it owns; losing a device stops its
actor at once, gaining one resumes the stored running instance through the restore path."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.metrics import Metrics
from gateway.tasks.core import (
    InstanceColumns,
    StepColumns,
)
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


@pytest.fixture
async def owned_rig(fast_catalog: Path) -> AsyncIterator[OwnershipRig]:
    metrics, mqtt, owns = Metrics(), FakePublisher(), Owned()
    board, recorder = FakeBoard(clip_ms=300), FakeRecorder()

    async def load_running() -> list[tuple[InstanceColumns, Sequence[StepColumns]]]:
        return _running(recorder)

    async with running_tasks(
        fast_catalog, mqtt, metrics, board, min_window_ms=300, present=[DEV],
        mic=FakeMic(), recorder=recorder, assessment=FakeAssessment(),
        load_running=load_running, owns=owns, handover_delay_s=0.0,
    ) as svc:  # fmt: skip
        yield svc, mqtt, board, recorder, owns, metrics


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
