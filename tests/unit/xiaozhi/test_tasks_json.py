"""The task/mode JSON a Xiaozhi device's executor is told (client-architecture plan §11)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from gateway.tasks.core import InstanceColumns, InstanceState, PublishTaskEvent
from gateway.xiaozhi.tasks_json import XiaozhiTaskTeller, step_id, task_messages
from topics.xiaozhi import parse_xiaozhi_downlink

RECORD = InstanceColumns(
    instance_id="i1",
    device_id="aa_bb_cc_dd_ee_ff",
    app_id="english_learning",
    task_id="shadowing",
    lesson_id="unit01",
    mode="SHADOWING",
    priority=3,
    source="test",
    state=InstanceState.RUNNING,
    reason=None,
    created_ms=1,
)


def told(name: str, step: int | None = None, record: InstanceColumns | None = RECORD, **data: object) -> list[dict[str, object]]:  # fmt: skip
    event = PublishTaskEvent(name, "i1", step, data)
    return [m.model_dump(exclude_none=True) for m in task_messages("s1", event, record)]


def test_a_lesson_told_step_by_step() -> None:
    assert told("instance.started") == [
        {"type": "mode.set", "session_id": "s1", "mode": "SHADOWING", "task_instance_id": "i1"},
        {
            "type": "task.start",
            "session_id": "s1",
            "task_instance_id": "i1",
            "app_id": "english_learning",
            "task_id": "shadowing",
            "lesson_id": "unit01",
        },
    ]
    ids = {"session_id": "s1", "task_instance_id": "i1", "step_id": "i1:0"}
    assert told("step.played", 0) == [{"type": "step.start", **ids, "action": "play"}]
    assert told("window.opened", 0, window_ms=360) == [
        {"type": "step.start", **ids, "action": "listen", "timeout_ms": 360}
    ]
    assert told("window.opened", 0, window_ms="x") == [
        {"type": "step.start", **ids, "action": "listen"}
    ]
    assert told("instance.paused", 0, reason="paused") == [{"type": "task.pause", **ids}]
    assert told("instance.resumed", 0) == [{"type": "task.resume", **ids}]
    assert told("instance.cancelled", None, None, reason="button") == [
        {"type": "task.stop", "session_id": "s1", "task_instance_id": "i1", "reason": "button"},
        {"type": "mode.set", "session_id": "s1", "mode": "CHAT"},
    ]
    assert told("instance.completed")[0] == {
        "type": "task.stop",
        "session_id": "s1",
        "task_instance_id": "i1",
    }


def test_events_without_a_message() -> None:
    assert told("window.closed", 0) == []
    assert told("step.failed", 0) == []
    assert told("step.played") == []  # no step: nothing to start
    assert told("instance.started", record=None) == []
    assert told("instance.started", record=replace(RECORD, mode="QUIZ")) == []  # no such mode


def test_step_ids() -> None:
    assert step_id("i1", 3) == "i1:3"
    assert step_id("i1", None) is None


@dataclass
class FakeTaskDownlink:
    sessions: dict[str, str]
    sent: list[tuple[str, bytes]] = field(default_factory=list)

    def session_id(self, dev: str) -> str | None:
        return self.sessions.get(dev)

    def publish(self, dev: str, payload: bytes) -> None:
        self.sent.append((dev, payload))


def test_the_teller_tells_devices_with_a_session_only() -> None:
    channel = FakeTaskDownlink({"aa_bb_cc_dd_ee_ff": "s9"})
    teller = XiaozhiTaskTeller(channel)
    teller.task_event("aa_bb_cc_dd_ee_ff", PublishTaskEvent("step.played", "i1", 2), RECORD)
    teller.task_event("11_22_33_44_55_66", PublishTaskEvent("step.played", "i1", 2), RECORD)
    ((dev, payload),) = channel.sent
    assert dev == "aa_bb_cc_dd_ee_ff"
    message = parse_xiaozhi_downlink(payload)
    assert json.loads(payload)["session_id"] == "s9"
    assert message.type == "step.start"
