"""LiveCatalog: a reload is validated before anything changes, swaps the table whole, bumps
the version and tells its listeners; a TaskDef taken before the swap stays as it was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gateway.console.seams import lesson_choices
from gateway.tasks.catalog_live import LiveCatalog


def task(clips: list[str], mode: str = "PLAY_AUDIO") -> dict[str, Any]:
    return {
        "app_id": "app",
        "task_id": "t",
        "interaction_mode": mode,
        "lessons": [{"lesson_id": "l1", "clips": clips}],
    }


async def test_reload_swaps_validated_versions(tmp_path: Path) -> None:
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps([task(["a.mp3", "b.mp3"])]), encoding="utf-8")
    live, _ = LiveCatalog.load(path)
    swaps: list[int] = []
    live.add_swap_listener(lambda: swaps.append(1))
    live.add_swap_listener(lambda: swaps.append(2))
    first = live.current
    old = live.get("app", "t")
    assert old is not None
    assert first.version == 1
    assert first.tasks == 1

    path.write_text(json.dumps([task(["a.mp3"], mode="DANCE")]), encoding="utf-8")
    refused = await live.reload()
    assert not refused.ok
    assert refused.version == first
    assert [i.path for i in refused.issues] == ["$[0].interaction_mode"]
    assert live.get("app", "t") is old
    assert swaps == []

    path.write_text(json.dumps([task(["c.mp3"])]), encoding="utf-8")
    done = await live.reload()
    assert done.ok
    assert done.version.version == 2
    assert done.version.digest != first.digest
    new = live.get("app", "t")
    assert new is not None
    assert new.lessons[0].clips == ("c.mp3",)
    assert old.lessons[0].clips == ("a.mp3", "b.mp3")  # what a running lesson holds
    assert swaps == [1, 2]
    assert len(live) == 1


async def test_the_consoles_lesson_choices_follow_a_reload(tmp_path: Path) -> None:
    """The console reads its start and sync choices per page from the live catalog."""
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps([task(["a.mp3"])]), encoding="utf-8")
    live, _ = LiveCatalog.load(path)
    assert [c.key for c in lesson_choices(live)] == ["app/t/l1"]
    added = {**task(["b.mp3"]), "lessons": [{"lesson_id": "l2", "clips": ["b.mp3"]}]}
    added["task_id"] = "u"
    path.write_text(json.dumps([task(["a.mp3"]), added]), encoding="utf-8")
    assert (await live.reload()).ok
    assert [c.key for c in lesson_choices(live)] == ["app/t/l1", "app/u/l2"]
