"""Start admission under a flood: lesson starts wait for slots in one line shared by every
device, so whoever fills it delays or refuses everybody else's lessons."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.broker import Broker, new_device_id
from tests.support.lesson_rig import APP, LESSON, TASK, lesson_rig

pytestmark = pytest.mark.integration
FLOOD = 100


async def test_one_devices_flood_of_starts_cannot_fill_the_line_others_wait_in(
    broker: Broker, tmp_path: Path
) -> None:
    """Attack: a hundred start requests for one device at once (a backend bug, or a child's voice starts replayed), so its waiting starts take every admission slot for seconds and the next device's lesson start is refused overloaded.
    Defence: one device holds at most 8 requests in the line; the rest of its flood is refused overloaded at once, and another device's start gets the slot after those 8 and plays."""
    admission = {"start_rate_per_s": 10.0, "start_burst": 1, "start_max_wait_s": 5.0}
    async with lesson_rig(broker, tmp_path, runtime=admission) as rig:
        await rig.board_online()
        hog = new_device_id()  # never connects: a fresh runtime takes it as online
        assert max(await rig.backend.subscribe(f"snlpgw/v1/reply/{hog}")) < 128
        start = {"v": 1, "action": "start", "app_id": APP, "task_id": TASK, "lesson_id": LESSON,
                 "priority": 2, "source": "test"}  # fmt: skip
        for i in range(FLOOD):  # a hundred slots would reach 10 s ahead, past the 5 s wait
            body = json.dumps({**start, "id": f"flood-{i}"})
            await rig.backend.publish(f"snlpgw/v1/ctl/{hog}", body)
        reply = await rig.start(priority=2)  # the victim's start, after the whole flood
        assert reply["status"] == "accepted", reply
        await rig.wait_command("PLAY_MEDIA")

        # Every flood request is answered (refused at once, or accepted at once or after its
        # wait): nothing is silently lost.
        def flood_replies() -> list[dict[str, object]] | None:
            got = [r.body for r in rig.replies if str(r.body.get("ref", "")).startswith("flood-")]
            return got if len(got) >= FLOOD else None

        answers = await rig.watch.until(flood_replies, "a reply to every flood request")
        assert len({a["ref"] for a in answers}) == FLOOD
        refused = [a for a in answers if a["status"] != "accepted"]
        assert all(a.get("reason") == "overloaded" for a in refused), refused[:3]
        assert rig.metric("runtime_admission_refused_total") == len(refused)
        # How many were refused depends on how fast the flood reached the gateway against the
        # line's 10 a second (a flood slower than that is no flood): on a quiet machine most
        # are (8 wait, the rest refused at once); the victim got its lesson either way (above).
        print(f"flood: {len(refused)} refused, {FLOOD - len(refused)} accepted")
