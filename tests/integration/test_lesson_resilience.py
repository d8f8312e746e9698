"""Task runtime acceptance under failure, end to end: side paths down (manager API, store),
a gateway killed and restarted mid-lesson, a board that drops off the broker."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_lesson_control import (
    assert_back_in_chat,
    assert_clock_stepped,
    report_lateness,
)
from tests.support.broker import Broker
from tests.support.lesson_rig import CLIPS, clip_path, lesson_rig

pytestmark = pytest.mark.integration


def closed_port_url() -> str:
    """An http:// URL on a local port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def silent_manager() -> Iterator[str]:
    """An http:// URL whose server accepts connections (kernel backlog) and never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("fault", ["manager-down", "manager-and-store-down", "manager-hangs"])
async def test_lesson_completes_on_time_with_side_paths_down(
    broker: Broker, tmp_path: Path, fault: str
) -> None:
    with silent_manager() as hanging:
        url = hanging if fault == "manager-hangs" else closed_port_url()
        store: dict[str, object] = {"manager_url": url, "manager_retries": 1}
        if fault == "manager-and-store-down":
            # A directory where the SQLite file should be: SQLite really cannot open it.
            sqlite_path = tmp_path / "unwritable.sqlite3"
            sqlite_path.mkdir()
            store["sqlite_path"] = sqlite_path
        async with lesson_rig(broker, tmp_path, store=store) as rig:
            reply = await rig.start(priority=2)
            iid = reply["instance_id"]
            await rig.wait_event("instance.completed", instance_id=iid)
            # all 4 plays, each after its predecessor's close; windows as in a normal run
            assert_clock_stepped(rig, iid, [360, 360, 360, 360])
            late = report_lateness(rig)
            assert late["count"] == 4
            assert late["max"] >= 0
            assert_back_in_chat(rig)

            if fault == "manager-hangs":
                # The PUTs are still waiting for an answer while the lesson has completed.
                assert rig.metric("manager_put_attempts_total") >= 1
                assert rig.metric('manager_puts_total{result="ok"}') == 0
                return
            if fault == "manager-and-store-down":
                alarm = await rig.wait_alarm("store_failed")
                assert rig.metric("store_write_failures_total") >= 1
                assert rig.metric('store_writes_total{table="instances"}') == 0
                status, body = await rig.http_get(f"/task/instance/{iid}")
                assert status == 503, body
            else:
                alarm = await rig.wait_alarm("manager_failed")
                assert rig.metric('manager_puts_total{result="failed"}') >= 1
                assert rig.metric('manager_puts_total{result="ok"}') == 0
                assert rig.metric("store_write_failures_total") == 0
            assert rig.metric(f'ops_alarms_total{{alarm="{alarm.body["alarm"]}"}}') >= 1


async def test_killed_gateway_resumes_the_lesson_after_restart(
    broker: Broker, tmp_path: Path
) -> None:
    async with lesson_rig(broker, tmp_path, durations_ms=(300, 300, 600, 300)) as rig:
        iid = (await rig.start(priority=2))["instance_id"]
        done = [await rig.wait_event("window.closed", i, instance_id=iid) for i in (0, 1)]
        await rig.wait_event("step.played", 2, instance_id=iid)
        await rig.wait_command("PLAY_MEDIA", 3)
        await rig.store().flush()
        await rig.stop_gateway(kill=True)
        assert rig.find_event("instance.completed", instance_id=iid) is None
        assert rig.find_event("instance.cancelled", instance_id=iid) is None

        await rig.start_gateway()  # same data dir and SQLite, same broker; the board kept going
        restored = await rig.wait_event("instance.restored", instance_id=iid)
        assert restored.data == {"paused": False}
        await rig.wait_event("instance.completed", instance_id=iid)
        plays = [p.body["params"]["name"] for p in rig.commands("PLAY_MEDIA")]
        assert plays == [clip_path(c) for c in ("01.mp3", "02.mp3", "03.mp3", "03.mp3", "04.mp3")]
        replay = rig.commands("PLAY_MEDIA")[3]
        assert replay.body["id"] not in {p.body["id"] for p in rig.commands("PLAY_MEDIA")[:3]}
        assert rig.board.executed[replay.body["id"]] == 1, "the board must play the clip again"
        assert rig.find_event("step.failed", instance_id=iid) is None
        closed = [rig.find_event("window.closed", i, instance_id=iid) for i in range(4)]
        assert all(c is not None for c in closed)
        assert_back_in_chat(rig)

        await rig.store().flush()
        status, body = await rig.http_get(f"/task/instance/{iid}")
        assert status == 200, body
        assert body["instance"]["state"] == "completed"
        steps = body["steps"]
        assert [s["step_index"] for s in steps] == [0, 1, 2, 3]
        assert [s["prompt_text"] for s in steps] == [clip_path(c) for c in CLIPS]
        for step, event in zip(steps[:2], done, strict=True):
            assert step["window_closed_ms"] == event.data["actual_close_ms"]
        for step in steps:
            assert step["played_ms"] is not None
            assert step["window_closed_ms"] is not None
            assert step["failure"] is None
        assert steps[2]["played_ms"] > steps[1]["window_closed_ms"]


async def test_board_offline_pauses_and_return_within_grace_resumes(
    broker: Broker, tmp_path: Path
) -> None:
    async with lesson_rig(broker, tmp_path, durations_ms=(300, 600, 300, 300)) as rig:
        iid = (await rig.start(priority=2))["instance_id"]
        await rig.wait_event("step.played", 1, instance_id=iid)
        await rig.wait_command("PLAY_MEDIA", 2)
        rig.board.go_offline()
        paused = await rig.wait_event("instance.paused", instance_id=iid)
        assert paused.data == {"reason": "offline"}
        rig.board.come_back()
        await rig.wait_event("instance.resumed", instance_id=iid)
        await rig.wait_event("instance.completed", instance_id=iid)
        plays = [p.body["params"]["name"] for p in rig.commands("PLAY_MEDIA")]
        assert plays == [clip_path(c) for c in ("01.mp3", "02.mp3", "02.mp3", "03.mp3", "04.mp3")]
        for i in range(4):
            assert rig.find_event("window.closed", i, instance_id=iid) is not None
        assert rig.find_event("step.failed", instance_id=iid) is None
        assert_back_in_chat(rig)


async def test_board_offline_past_the_grace_cancels(broker: Broker, tmp_path: Path) -> None:
    async with lesson_rig(broker, tmp_path, runtime={"offline_grace_s": 0.3}) as rig:
        iid = (await rig.start(priority=2))["instance_id"]
        await rig.wait_event("window.opened", 0, instance_id=iid)
        # The grace runs from the moment the runtime learnt the board was gone, which lies
        # after this instant; an event's ``ts`` is stamped when it is published, so the paused
        # event's own stamp may trail that moment by however long the actor's queue took.
        offline_from_ms = time.time() * 1000
        rig.board.go_offline()
        paused = await rig.wait_event("instance.paused", instance_id=iid)
        assert paused.data == {"reason": "offline"}
        cancelled = await rig.wait_event("instance.cancelled", instance_id=iid)
        assert cancelled.data == {"reason": "offline"}
        assert cancelled.body["ts"] - offline_from_ms >= 300 - 1
        assert cancelled.body["ts"] >= paused.body["ts"]
        assert_back_in_chat(rig)
        assert len(rig.commands("PLAY_MEDIA")) == 1
        rig.board.come_back()
        await rig.board_online()
        await rig.store().flush()
        _, body = await rig.http_get(f"/task/instance/{iid}")
        assert (body["instance"]["state"], body["instance"]["reason"]) == ("cancelled", "offline")
