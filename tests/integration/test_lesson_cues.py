"""Cues end to end (spec D5 SOUND, D10 INDICATE): a real broker, the composed gateway and the
board simulator; the board's sound.completed / wait.elapsed answers are counted, never fatal."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.broker import Broker
from tests.support.lesson_rig import LessonRig, lesson_rig

pytestmark = pytest.mark.integration


def cues(rig: LessonRig, instance_id: str) -> list[str]:
    """SOUND / INDICATE the board received for the instance, in order."""
    out = []
    for c in rig.commands():
        body = c.body
        if not body["id"].startswith(instance_id):
            continue
        if body["cmd"] == "SOUND":
            out.append(f"SOUND:{body['params']['type']}")
        elif body["cmd"] == "INDICATE":
            out.append(f"INDICATE:{body['params']['state']}")
    return out


async def test_a_lesson_cues_the_board_at_its_moments(broker: Broker, tmp_path: Path) -> None:
    async with lesson_rig(broker, tmp_path) as rig:
        iid = (await rig.start())["instance_id"]
        await rig.wait_event("instance.completed", instance_id=iid)
        await rig.wait_command("INDICATE", 2 + 4 * 3)
        step = ["INDICATE:PLAYING", "SOUND:ding", "INDICATE:LISTENING", "INDICATE:PROCESSING"]
        assert cues(rig, iid) == [
            "INDICATE:TASK_RUNNING",
            *(step * 4),
            "SOUND:success",
            "INDICATE:TASK_COMPLETE",
        ]
        # Every sound answered with sound.completed, counted: a second lesson's board events
        # come after those answers on the board's one connection, so they were handled by then.
        again = (await rig.start())["instance_id"]
        await rig.wait_event("instance.completed", instance_id=again)
        key = 'board_events_total{evt="sound.completed",form="structured"}'
        assert rig.metric(key) >= 5
        assert rig.board.stats["ack_accepted"] == len(rig.commands())


async def test_cue_answers_and_strangers_are_counted_not_fatal(
    broker: Broker, tmp_path: Path
) -> None:
    async with lesson_rig(broker, tmp_path) as rig:
        rig.board._event("wait.elapsed", "w1", {"ms": 800})  # a WAIT of some other client
        rig.board._event("wait.cancelled", None, {})
        rig.board._event("sound.completed", None, {"type": "x" * 65})  # too long: dropped
        rig.board._event("sound.exploded", None, {})
        iid = (await rig.start())["instance_id"]  # the gateway goes on as before
        await rig.wait_event("instance.completed", instance_id=iid)
        for evt in ("wait.elapsed", "wait.cancelled"):
            assert rig.metric(f'board_events_total{{evt="{evt}",form="structured"}}') == 1
        # the over-long sound type and the unknown event: dropped and counted
        assert rig.metric('board_inbound_dropped_total{kind="evt",reason="invalid"}') == 1
        assert rig.metric('board_inbound_dropped_total{kind="evt",reason="unknown_type"}') == 1
