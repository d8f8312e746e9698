"""A tiny driver for DeviceRuntime: a plain-number clock and effect filters."""

from __future__ import annotations

import itertools
from typing import Any, TypeVar

from gateway.tasks.core import (
    AudioPhase,
    Catalog,
    DeviceRuntime,
    PlaybackEvent,
    RuntimeConfig,
    RuntimeEffect,
    RuntimeEvent,
    SendCommand,
    TaskDef,
)

E = TypeVar("E")

SHADOWING: dict[str, Any] = {
    "app_id": "english_learning",
    "task_id": "shadowing",
    "interaction_mode": "SHADOWING",
    "listen_ratio": 1.5,
    "lessons": [
        {
            "lesson_id": "unit01",
            "clips": ["03.mp3", "01.mp3", "02.mp3", "04.mp3"],
            "transcripts": {"01.mp3": "Good morning."},
            "sentences": ["Good morning.", "How are you?", "I am fine.", "See you."],
            "durations_ms": {"02.mp3": 1000},
        }
    ],
}
REPEATER: dict[str, Any] = {
    "app_id": "english_learning",
    "task_id": "repeater",
    "interaction_mode": "PLAY_AUDIO",
    "repeat": 3,
    "lessons": [{"lesson_id": "unit01", "clips": ["01.mp3"]}],
}
LISTEN: dict[str, Any] = {
    "app_id": "english_learning",
    "task_id": "listen",
    "interaction_mode": "LISTEN",
    "listen_ms": 3000,
    "lessons": [{"lesson_id": "free"}],
}
PATH = "/english_learning/shadowing/lessons/unit01/"


def catalog(*tasks: dict[str, Any]) -> Catalog:
    defs = [TaskDef.model_validate(t) for t in (tasks or (SHADOWING, REPEATER, LISTEN))]
    return Catalog({t.key: t for t in defs})


class Driver:
    """Feeds events at given times and keeps every effect."""

    def __init__(self, **kw: Any) -> None:
        ids = (f"i{n}" for n in itertools.count(1))
        kw.setdefault("config", RuntimeConfig(completion_grace_ms=500, offline_grace_ms=60_000))
        kw.setdefault("new_id", lambda: next(ids))
        self.rt = DeviceRuntime("aa_bb_cc_dd_ee_ff", kw.pop("catalog", None) or catalog(), **kw)
        self.log: list[RuntimeEffect] = []

    def at(self, now: float, event: RuntimeEvent) -> list[RuntimeEffect]:
        out = self.rt.handle(event, now)
        self.log += out
        return out

    def tick(self, now: float) -> list[RuntimeEffect]:
        out = self.rt.on_time(now)
        self.log += out
        return out

    def last_play(self) -> SendCommand:
        return [c for c in commands(self.log) if c.cmd == "PLAY_MEDIA"][-1]

    def complete(self, now: float, duration_ms: int | None = 2000) -> list[RuntimeEffect]:
        play = self.last_play()
        return self.at(now, PlaybackEvent(AudioPhase.COMPLETED, play.command_id, None, duration_ms))


def of(kind: type[E], effects: list[RuntimeEffect]) -> list[E]:
    return [e for e in effects if isinstance(e, kind)]


def commands(effects: list[RuntimeEffect], cmd: str | None = None) -> list[SendCommand]:
    return [c for c in of(SendCommand, effects) if cmd is None or c.cmd == cmd]


def played(effects: list[RuntimeEffect]) -> list[str]:
    return [str(c.params["name"]) for c in commands(effects, "PLAY_MEDIA")]
