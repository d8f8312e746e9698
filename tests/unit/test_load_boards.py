"""The load harness's board (bench/load/boards.py ``LoadBoard``): its lean path for a lesson's
routine commands puts the same acks and events on the wire as the board simulator it extends,
and hands everything else to the simulator."""

from __future__ import annotations

import json

import pytest

from bench.load.boards import LoadBoard
from gateway.simulators import board as sim_board
from gateway.simulators.board import BoardSimulator, SimOptions

DEV = "b1_00_00_00_00_01"
PATH = "/load/shadowing/lessons/l1/c01.mp3"


def _command(cmd: str, ref: str, params: dict[str, object]) -> bytes:
    body = {"v": 1, "id": ref, "ts": 1_700_000_000_000, "cmd": cmd, "params": params,
            "prio": 2, "ttl_ms": 10_000}  # fmt: skip
    return json.dumps(body).encode()


STEP = [
    _command("LISTEN_START", "9f0c.1", {"mode": "auto", "timeout_ms": 1800}),
    _command("SOUND", "9f0c.2", {"type": "ding"}),
    _command("INDICATE", "9f0c.3", {"state": "LISTENING"}),
    _command("LISTEN_STOP", "9f0c.4", {}),
    _command("PLAY_MEDIA", "9f0c.5", {"name": PATH, "repeat": 1, "speed": 1.0}),
    _command("PLAY_MEDIA", "9f0c.5", {"name": PATH}),  # a resend: acked duplicate
    _command("PLAY_MEDIA", "9f0c.6", {"name": PATH, "speed": 9.0}),  # clamped to 2.0
    _command("PLAY_MEDIA", "9f0c.7", {"name": PATH, "speed": 9.0}),  # the same, known
    _command("STOP_MEDIA", "9f0c.8", {}),  # not a routine one: the simulator's path
    _command("INDICATE", 'quo"te', {"state": "IDLE"}),  # an id JSON must escape: the same
    _command("LISTEN_START", "9f0c.9", {"max_ms": 1800}),  # refused by the contract: the same
    _command("INDICATE", "9f0c.10", {"state": "DANCING"}),  # refused
]
SIMULATORS_OWN = 2  # parsed and kept by the simulator: STOP_MEDIA and the quoted id


def _published(board: BoardSimulator) -> list[tuple[str, bytes]]:
    if isinstance(board, LoadBoard):
        return [(topic, payload) for topic, payload, _ in board._backlog]
    out = []
    while not board._out.empty():
        topic, payload, _, _ = board._out.get_nowait()
        out.append((topic, payload))
    return out


@pytest.mark.asyncio
async def test_the_lean_path_publishes_what_the_simulator_publishes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sim_board, "_ms", lambda: 1_700_000_000_123)
    boards: list[BoardSimulator] = []
    for kind in (BoardSimulator, LoadBoard):
        board = kind(DEV, host="127.0.0.1", port=1, username=DEV, password="x",
                     options=SimOptions(durations={PATH: 1500}))  # fmt: skip
        board._tg = _NoTasks()  # type: ignore[assignment]  # a play's timer is not run here
        for payload in STEP:
            board._on_command(payload)
        boards.append(board)
    simulator, lean = (_published(b) for b in boards)
    assert lean == simulator
    assert len(lean) >= len(STEP) + 3  # acks, audio.started, sound.completed, audio.stopped
    assert boards[1].executed == boards[0].executed
    assert boards[1].stats == boards[0].stats
    assert boards[0].stats["bad_commands"] == 2  # the two refused (the simulator's path too)
    # the lean path was taken for the routine ones: the simulator's path keeps what it parsed
    assert len(boards[1].received) == SIMULATORS_OWN


class _NoTasks:
    def create_task(self, coro: object, name: str | None = None) -> None:
        coro.close()  # type: ignore[attr-defined]
