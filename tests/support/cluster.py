"""Gateway *processes* for the scale-out tests (the dev stack's :class:`GatewayProcess`): each
with its own id, data dir, ephemeral ports and log file, all on one broker and one store.

A process is killed with SIGKILL (no shutdown path: the broker publishes its LWT). The
ownership log is read back from each log file: the task runtime logs ``ownership gained DEV
at_ms=T`` when it starts acting for a device and ``ownership released DEV at_ms=T`` when it
stops (gateway/tasks/service.py).
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import psycopg

from devstack.gateway import Use, gateway_sections
from devstack.process import GatewayProcess
from tests.support.broker import Broker
from tests.support.lesson_rig import CLIPS, TimedBoard, Watch, clip_path
from tests.support.mqtt_client import ClientSession, Received

OWNERSHIP = re.compile(r"ownership (gained|released) (\S+) at_ms=(\d+)")


def cluster_gateway(root: Path, gateway_id: str, sections: dict[str, Any]) -> GatewayProcess:
    """One gateway process of the test cluster: its own id and data dir under ``root``."""
    settings = {**sections, "gateway_id": gateway_id, "data_dir": str(root / "data")}
    return GatewayProcess(root, settings)


class Logged(Protocol):
    """A gateway process whose log is read back: the dev stack's, or one the recipe started."""

    @property
    def gateway_id(self) -> str: ...
    @property
    def log_path(self) -> Path: ...
    @property
    def killed_at_ms(self) -> int | None: ...


def ownership(gw: Logged) -> list[tuple[str, str, int]]:
    """``(event, device, at_ms)`` in the order of ``gw``'s log."""
    text = gw.log_path.read_text(errors="replace")
    return [(m[1], m[2], int(m[3])) for m in OWNERSHIP.finditer(text)]


def cluster_sections(
    broker: Broker, *, store_url: str, catalog: Path, min_window_ms: int, heartbeat_s: float
) -> dict[str, Any]:
    """Settings every gateway of the test cluster shares (ids and data dirs are per process):
    the dev stack's, plus the store, the cluster and the lesson timing."""
    return gateway_sections(
        broker,
        use=Use.TEST,
        store={"url": store_url},
        cluster={"enabled": True, "handover_delay_s": 1.0},
        asr={"engine": "none"},
        # generous: on two busy cores a board's audio.completed can take seconds to be handled,
        # and the test is about ownership, not the clip watchdog
        runtime={
            "catalog_path": str(catalog),
            "min_window_ms": min_window_ms,
            "completion_grace_ms": 60_000,
        },
        board={"heartbeat_s": heartbeat_s},
        ops={"metrics_interval_s": 0.5, "shutdown_timeout_s": 3.0, "log_level": "INFO"},
    )


def intervals(gateways: Sequence[Logged], end_ms: int) -> dict[str, list[tuple[int, int, str]]]:
    """Per device, the ``(from_ms, to_ms, gateway)`` spans during which a gateway acted for it
    up to ``end_ms`` (what the shutdown of the test cluster moves later is not looked at); a span
    still open ends at the gateway's kill time, else at ``end_ms``."""
    spans: dict[str, list[tuple[int, int, str]]] = {}
    for gw in gateways:
        open_since: dict[str, int] = {}
        for event, dev, at in ownership(gw):
            if at > end_ms:
                break
            if event == "gained":
                assert dev not in open_since, f"{gw.gateway_id} gained {dev} twice"
                open_since[dev] = at
            else:
                start = open_since.pop(dev)
                spans.setdefault(dev, []).append((start, at, gw.gateway_id))
        for dev, start in open_since.items():
            spans.setdefault(dev, []).append((start, gw.killed_at_ms or end_ms, gw.gateway_id))
    return spans


class ScaleSeen:
    def __init__(self) -> None:
        self.metrics: dict[str, dict[str, float]] = {}
        self.status: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.replies: list[dict[str, Any]] = []
        self.completed: Counter[str] = Counter()  # instance id → instance.completed seen


async def pump(session: ClientSession, seen: ScaleSeen, watch: Watch) -> None:
    while True:
        message: Received = await session.queue.get()
        try:
            body = json.loads(message.payload)
        except ValueError:
            continue
        parts = message.topic.split("/")
        if message.topic.endswith("/metrics"):
            seen.metrics[parts[3]] = body["metrics"]
        elif parts[2] == "gw":
            seen.status[parts[3]] = body
        elif parts[2] == "task":
            seen.events.append(body)
            if body.get("event") == "instance.completed":
                seen.completed[body.get("instance_id") or ""] += 1
        elif parts[2] == "reply":
            seen.replies.append(body)
        watch.poke()


class PlayingBoard(TimedBoard):
    """The timed board simulator, also keeping its PLAY_MEDIA clips as they arrive (one per
    command id: a resend is the same command), so the test's waits stay cheap to re-check."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plays: list[tuple[str, float]] = []
        self._play_ids: set[str] = set()

    def _on_command(self, payload: bytes) -> None:
        before = len(self.commands)
        super()._on_command(payload)
        for c in self.commands[before:]:
            cid = c.body.get("id")
            if c.body.get("cmd") == "PLAY_MEDIA" and cid not in self._play_ids:
                self._play_ids.add(cid)
                self.plays.append((c.body["params"]["name"], c.at_ms))


class StoreView:
    """Which instances the shared store has ``completed``; read at most once a second (the
    waits re-check on every MQTT arrival)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._at = 0.0
        self._done: set[str] = set()

    def completed(self, ids: set[str]) -> set[str]:
        if time.monotonic() - self._at >= 1.0:
            self._at = time.monotonic()
            with psycopg.connect(self._url) as conn:
                rows = conn.execute(
                    "SELECT id FROM instances WHERE state = 'completed' AND id = ANY(%s)",
                    (list(ids),),
                ).fetchall()
            self._done |= {r[0] for r in rows}
        return self._done & ids


def check_boards(boards: list[PlayingBoard], moved: list[str], killed_at_ms: int) -> None:
    """Every clip, in order; only the killed gateway's in-flight step heard again, after it."""
    expected = [clip_path(c) for c in CLIPS]
    for b in boards:
        clips = b.plays
        paths = [p for p, _ in clips]
        collapsed = [p for n, p in enumerate(paths) if n == 0 or p != paths[n - 1]]
        assert collapsed == expected, (b.dev, paths)
        repeats = [n for n in range(1, len(paths)) if paths[n] == paths[n - 1]]
        assert len(repeats) <= (1 if b.dev in moved else 0), (b.dev, paths)
        for n in repeats:
            assert clips[n][1] >= killed_at_ms, ("replay before the kill", b.dev)


def check_store(store_url: str, instance_of: dict[str, str]) -> None:
    """Each instance completed with steps 0..3 exactly, each played and its window closed."""
    with psycopg.connect(store_url) as conn:
        rows = conn.execute(
            "SELECT device, id, state FROM instances WHERE id = ANY(%s)",
            (list(instance_of.values()),),
        ).fetchall()
        steps = conn.execute(
            "SELECT instance_id, step_index, played_ms, window_closed_ms, failure FROM steps "
            "WHERE instance_id = ANY(%s) ORDER BY instance_id, step_index",
            (list(instance_of.values()),),
        ).fetchall()
    assert sorted(rows) == sorted((d, i, "completed") for d, i in instance_of.items()), rows
    by_instance: dict[str, list[int]] = {}
    for instance_id, index, played, closed, failure in steps:
        assert (played is None, closed is None, failure) == (False, False, None), (
            instance_id,
            index,
        )
        by_instance.setdefault(instance_id, []).append(index)
    assert by_instance == {i: [0, 1, 2, 3] for i in instance_of.values()}


def check_ownership(
    spans: dict[str, list[tuple[int, int, str]]],
    owners: dict[str, str | None],
    victim_id: str,
    killed_at_ms: int,
) -> None:
    """One gateway acting for a device at any time; only the victim's devices moved, to a
    survivor, after the kill."""
    killed = killed_at_ms
    for dev, owner in owners.items():
        mine = sorted(spans.get(dev, []))
        assert mine, f"nobody acted for {dev}"
        for (_, end, gw_a), (start, _, gw_b) in itertools.pairwise(mine):
            assert start >= end, f"{dev}: {gw_a} and {gw_b} acted at once: {mine}"
        if owner == victim_id:
            assert mine[0][2] == victim_id, mine
            assert any(gw != owner and start >= killed for start, _, gw in mine), mine
        else:
            assert {gw for _, _, gw in mine} == {owner}, mine
