"""A Xiaozhi device told its task and mode (client-architecture plan §11, §14), end to end: a
real broker, the composed gateway, the board simulator playing the clips and a Xiaozhi device
simulator that follows mode.set / task.* / step.start the way Phase-2 firmware does, so its
microphone is the task's exactly in the listen windows, without a board-side mapping."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.asr_engines import RaisingEngine
from tests.support.broker import Broker
from tests.support.voice_lesson import lesson_rig, start

pytestmark = pytest.mark.integration

TASK_TYPES = ("mode.set", "task.start", "task.stop", "task.pause", "task.resume", "step.start")


async def test_a_device_told_its_mode_listens_in_the_windows(
    broker: Broker, tmp_path: Path, device_id: str
) -> None:
    async with lesson_rig(broker, tmp_path, device_id, RaisingEngine, clip_ms=300) as (
        gw,
        seen,
        device,
        backend,
    ):
        iid = await start(backend, device_id, seen)
        await seen.until(lambda: bool(seen.named("instance.completed")), 30)
        await device.expect("mode.set", mode="CHAT")
        told = [m for m in device.inbox if m["type"] in TASK_TYPES]
        steps = [("step.start", f"{iid}:{i}", a) for i in range(4) for a in ("play", "listen")]
        assert [(m["type"], m.get("step_id"), m.get("action")) for m in told] == [
            ("mode.set", None, None),
            ("task.start", None, None),
            *steps,
            ("task.stop", None, None),
            ("mode.set", None, None),
        ]
        assert device.hello is not None
        assert {m["session_id"] for m in told} == {device.hello.session_id}
        assert all(m["task_instance_id"] == iid for m in told[:-1])
        assert told[0]["mode"] == "SHADOWING"
        assert told[1]["task_id"] == "shadowing"
        windows = [e["data"]["window_ms"] for e in seen.named("window.opened")]
        assert [m["timeout_ms"] for m in told if m.get("action") == "listen"] == windows
        # the device listened in each window, and is back in CHAT with its mic not the task's
        assert device.listened_steps == [f"{iid}:{i}" for i in range(4)]
        assert (device.mode, device.task_listening) == ("CHAT", False)
        # its step.started reports reached the gateway: parsed and counted, nothing else
        snapshot = gw.service.metrics.snapshot()
        key = 'snlpgw_xiaozhi_control_messages_total{type="step.started"}'
        assert snapshot.get(key, 0) >= 1, sorted(k for k in snapshot if "control" in k)
