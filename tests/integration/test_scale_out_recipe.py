"""The scale-out recipe of ``docs/scale-out.md``, run as written: ``deploy/scale_out_local.py``
brings up one Mosquitto, one PostgreSQL and 3 gateways (data dirs of their own, the broker's
gateway password through ``mqtt.password_file``, cluster mode on); users and boards are
provisioned with ``snlpgw provision --data-dir <the broker's data dir>``; 9 simulated boards
run the 4-step lesson; the gateway owning the most boards is SIGKILLed mid-lesson. Then every
lesson completes under a new owner (the store has every step, each board heard every clip in
order, one gateway acted for a device at a time) and SIGTERM to the script stops everything.

The lesson tuning (catalog, windows, heartbeats, metrics period) reaches the gateways as
``SNLPGW_*`` variables given to the script, as the doc says any setting does. Every wait is
woken by arrivals (script output, MQTT messages) and bounded; the script's own readiness
waits are its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devstack.broker import wait_ready
from gateway.cluster import owner_of
from gateway.simulators.board import SimOptions
from tests.support.broker import new_device_id
from tests.support.cluster import (
    PlayingBoard,
    ScaleSeen,
    StoreView,
    check_boards,
    check_ownership,
    check_store,
    intervals,
    pump,
)
from tests.support.lesson_rig import APP, CLIPS, LESSON, TASK, Watch, clip_path, fast_catalog
from tests.support.mqtt_client import mqtt_client

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).parents[2]
RECIPE = ROOT / "deploy" / "scale_out_local.py"
SNLPGW = str(Path(sys.executable).with_name("snlpgw"))
GATEWAYS = 3
BOARDS = 9
DURATIONS_MS = (1500, 1500, 1500, 1500)
MIN_WINDOW_MS = 1200
HEARTBEAT_S = 5.0
START_S = 150.0  # PostgreSQL, Mosquitto and three gateway processes on two busy cores
LESSON_S = 120.0
STOP_S = 60.0


@dataclass(frozen=True)
class RecipeBroker:
    host: str
    port: int


@dataclass(frozen=True)
class ProvisionedLogin:
    username: str
    password: str | None
    host: str  # where this login connects: devices have a listener of their own
    port: int


@dataclass
class RecipeGateway:
    """A gateway the script started (what :func:`tests.support.cluster.intervals` reads)."""

    gateway_id: str
    log_path: Path
    pid: int
    killed_at_ms: int | None = None


@dataclass
class Script:
    """The recipe script's process and every line it printed (read by one task)."""

    proc: asyncio.subprocess.Process
    watch: Watch
    lines: list[str] = field(default_factory=list)

    async def read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            self.lines.append(line.decode(errors="replace").rstrip("\n"))
            self.watch.poke()
        await self.proc.wait()
        self.watch.poke()

    def said(self, prefix: str) -> bool | None:
        if any(line.startswith(prefix) for line in self.lines):
            return True
        self.check_running()
        return None

    def check_running(self) -> None:
        if self.proc.returncode is not None:
            raise AssertionError(f"the script ended ({self.proc.returncode}):\n{self.output}")

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


def environ(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")


async def provision(broker_dir: str, name: str, role: str = "device") -> ProvisionedLogin:
    """``snlpgw provision --data-dir <broker's data dir>``, as the doc says."""
    argv = [SNLPGW, "provision", "--data-dir", broker_dir, "--role", role, name]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    creds = json.loads(out)
    host, port = creds["broker_url"].removeprefix("mqtt://").split(":")
    return ProvisionedLogin(creds["username"], creds["password"], host, int(port))


@pytest.mark.timeout(600)
async def test_the_recipe_script_three_gateways_one_killed_mid_lesson(tmp_path: Path) -> None:
    catalog = fast_catalog(
        tmp_path / "catalog.json", durations_ms=DURATIONS_MS, min_window_ms=MIN_WINDOW_MS
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNLPGW_")}
    env |= {  # the lesson's tuning, for every gateway (the doc: any SNLPGW_* given reaches all)
        "SNLPGW_RUNTIME__CATALOG_PATH": str(catalog),
        "SNLPGW_RUNTIME__MIN_WINDOW_MS": str(MIN_WINDOW_MS),
        "SNLPGW_RUNTIME__COMPLETION_GRACE_MS": "60000",  # about ownership, not the watchdog
        "SNLPGW_BOARD__HEARTBEAT_S": str(HEARTBEAT_S),
        "SNLPGW_ASR__ENGINE": "none",
        "SNLPGW_OPS__METRICS_INTERVAL_S": "0.5",
        "SNLPGW_OPS__SHUTDOWN_TIMEOUT_S": "3",
    }
    root = tmp_path / "cluster"
    watch = Watch()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(RECIPE), str(root), "--gateways", str(GATEWAYS),
        env=env, cwd=ROOT, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    script = Script(proc, watch)
    seen = ScaleSeen()
    async with asyncio.TaskGroup() as tg:
        reader = tg.create_task(script.read(), name="test.recipe.stdout")
        helpers: list[asyncio.Task[Any]] = []
        try:
            await watch.until(lambda: script.said("ready: "), "the script ready", START_S)
            manifest = json.loads((root / "cluster.json").read_text())
            broker_dir = manifest["broker"]["data_dir"]
            host, port = manifest["broker"]["url"].removeprefix("mqtt://").split(":")
            broker = RecipeBroker(host, int(port))
            broker_pid = manifest["broker"]["pid"]
            gws = [RecipeGateway(g["id"], Path(g["log"]), g["pid"]) for g in manifest["gateways"]]
            ids = [g.gateway_id for g in gws]
            # every gateway logs in with the broker's password, read from the shared file
            shared_secret = f"SNLPGW_MQTT__PASSWORD_FILE={broker_dir}/secrets/gateway.password"
            for gw in gws:
                assert shared_secret in environ(gw.pid), (gw.gateway_id, "no password file")

            def reload() -> None:
                os.kill(broker_pid, signal.SIGHUP)

            async def accepted(login: ProvisionedLogin) -> ProvisionedLogin:
                """Once the broker has reloaded its files (Mosquitto drops a SIGHUP that
                arrives during another reload: signalled again while refused)."""
                await asyncio.to_thread(
                    wait_ready, login.host, login.port, login.username, login.password,
                    reload=reload, timeout_s=30.0,
                )  # fmt: skip
                return login

            tag = uuid.uuid4().hex[:6]
            ops_login = await accepted(await provision(broker_dir, f"ops-{tag}", "ops"))
            backend_login = await accepted(await provision(broker_dir, f"be-{tag}", "backend"))
            devs = [new_device_id() for _ in range(BOARDS)]
            durations = {clip_path(c): d for c, d in zip(CLIPS, DURATIONS_MS, strict=True)}
            boards = []
            for dev in devs:
                login = await accepted(await provision(broker_dir, dev))
                assert login.port == manifest["broker"]["devices_port"]  # their own listener
                board = PlayingBoard(
                    dev, host=login.host, port=login.port, username=login.username,
                    password=login.password, watch=watch,
                    options=SimOptions(heartbeat_s=HEARTBEAT_S, durations=durations),
                )  # fmt: skip
                boards.append(board)

            async with (
                mqtt_client(broker, ops_login) as ops,
                mqtt_client(broker, backend_login) as backend,
            ):
                await ops.subscribe("snlpgw/v1/ops/+/metrics")
                await ops.subscribe("snlpgw/v1/gw/+/status")
                await backend.subscribe("snlpgw/v1/task/+")
                await backend.subscribe("snlpgw/v1/reply/+")
                helpers += [
                    tg.create_task(pump(ops, seen, watch), name="test.ops"),
                    tg.create_task(pump(backend, seen, watch), name="test.backend"),
                ]

                def settled() -> bool | None:
                    script.check_running()
                    return (
                        all(
                            seen.metrics.get(i, {}).get("snlpgw_cluster_members") == GATEWAYS
                            and seen.metrics[i].get("snlpgw_cluster_settled") == 1
                            for i in ids
                        )
                        or None
                    )

                await watch.until(settled, "3 settled gateways", START_S)
                helpers += [tg.create_task(b.run(), name=f"device[{b.dev}].sim") for b in boards]
                for b in boards:
                    await asyncio.wait_for(b.connected.wait(), START_S)
                await watch.until(
                    lambda: (
                        all(
                            seen.metrics.get(i, {}).get("snlpgw_board_devices_tracked", 0) >= BOARDS
                            for i in ids
                        )
                        or None
                    ),
                    "every gateway tracks every board",
                    START_S,
                )

                refs = {}
                for dev in devs:
                    rid = f"rq-{uuid.uuid4().hex[:10]}"
                    refs[rid] = dev
                    body = {"v": 1, "id": rid, "action": "start", "app_id": APP}
                    body |= {"task_id": TASK, "lesson_id": LESSON, "priority": 2}
                    await backend.publish(f"snlpgw/v1/ctl/{dev}", json.dumps(body))
                await watch.until(
                    lambda: (
                        len({r["ref"] for r in seen.replies if r.get("ref") in refs}) == BOARDS
                        or None
                    ),
                    "a reply to every start",
                    START_S,
                )
                instance_of = {}
                for r in seen.replies:
                    if r.get("ref") in refs:
                        assert r["status"] == "accepted", r
                        instance_of[refs[r["ref"]]] = r["instance_id"]

                # -- the busiest gateway killed mid-lesson --------------------------------------
                owners = {dev: owner_of(dev, ids) for dev in devs}
                victim = max(gws, key=lambda g: sum(o == g.gateway_id for o in owners.values()))
                moved = [d for d in devs if owners[d] == victim.gateway_id]
                await watch.until(
                    lambda: all(len(b.plays) >= 2 for b in boards) or None,
                    "every board in its second step",
                    LESSON_S,
                )
                os.kill(victim.pid, signal.SIGKILL)
                victim.killed_at_ms = time.time_ns() // 1_000_000
                played_at_kill = {b.dev: len(b.plays) for b in boards}
                assert any(played_at_kill[d] < len(CLIPS) for d in moved), "not mid-lesson"
                await watch.until(
                    lambda: script.said(f"gateway {victim.gateway_id} exited (-9)"),
                    "the script reports the kill",
                    LESSON_S,
                )

                store = StoreView(manifest["store_url"])
                moved_ids = {instance_of[d] for d in moved}

                def all_done() -> bool | None:
                    left = {i for i in instance_of.values() if not seen.completed[i]}
                    done = not left or (left <= moved_ids and left <= store.completed(left))
                    return done or None

                await watch.until(all_done, "every lesson completed", LESSON_S)
                end_ms = time.time_ns() // 1_000_000
                # The store is written on each gateway's store thread after the lesson's last
                # event is published: wait for it (bounded) before reading it whole.
                every = set(instance_of.values())
                async with asyncio.timeout(LESSON_S):
                    while store.completed(every) != every:  # noqa: ASYNC110 - a database, no event
                        await asyncio.sleep(0.2)
                check_store(manifest["store_url"], instance_of)  # before the script stops it
        finally:
            for task in helpers:
                task.cancel()
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)  # the script stops what it started
            async with asyncio.timeout(STOP_S):
                await reader

    assert proc.returncode == 0, script.output
    assert script.lines[-1] == "stopped", script.output
    started = [g.pid for g in gws] + [broker_pid, manifest["postgres"]["pid"]]
    for pid in started:  # reaped by the script: gone
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    check_boards(boards, moved, victim.killed_at_ms)
    check_ownership(intervals(gws, end_ms), owners, victim.gateway_id, victim.killed_at_ms)
