"""Listen-window timer accuracy with N boards running shadowing lessons at once (SPEC §2.1).

Run from the repo root: ``python -m bench.timer_bench``. For each N: a local Mosquitto with the
project config, the composed gateway in this process (``gateway.app.build_gateway``, ASR off:
no speech is sent), and, in a child process (so their work does not share the gateway's
loop), N board simulators plus a backend observer. The observer starts one lesson per board at
the same instant (8 clips of 250 ms, windows of 300 ms: all boards' windows close together,
the worst case) and records every ``window.closed`` event; each board records when each
PLAY_MEDIA reached it. Figures:

* window-close lateness = actual - planned close as the gateway reports it (window.closed
  events; also its own ``snlpgw_window_lateness_ms`` p50/p99/max);
* close → next PLAY_MEDIA = board receipt - actual close (wall clocks, same machine).

Writes bench/results/timer.json and bench/results/timer.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import resource
import socket
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiomqtt

from bench.stats import quantile, record
from devstack.broker import local_broker, wait_connectable
from devstack.gateway import Use, gateway_settings, running_gateway
from gateway.broker.credentials import provision
from gateway.simulators.board import BoardSimulator, SimOptions

SIZES = (1, 50, 200)
# (sockets, in flight). Sockets "default": the boards' and the broker's sockets as they open
# them (Nagle on; the gateway always sets TCP_NODELAY on its own); "nodelay": TCP_NODELAY on the
# boards' and the broker's sockets too. In flight (board.max_in_flight / mqtt.max_inflight):
# 1/1 is the old way (a board's PLAY_MEDIA waits for LISTEN_STOP's ack, and every gateway
# publish waits for the previous one's PUBACK), 4/20 the pipelined defaults.
# The gateway and the simulated boards run on asyncio sockets, which always have TCP_NODELAY
# (the Nagle comparison of earlier runs is in timer.md's git history).
VARIANTS = (("nodelay", (1, 1)), ("nodelay", (4, 20)))
CLIPS = 8
CLIP_MS = 250
WINDOW_MS = 300  # max(min_window_ms=300, 1.2 x 250)
APP, TASK, LESSON = "bench", "shadowing", "l1"
CHILD_TIMEOUT_S = 240.0  # generous: the machine may be shared (see the load column)


def _clip(i: int) -> str:
    return f"c{i + 1:02d}.mp3"


def write_catalog(path: Path) -> Path:
    clips = [_clip(i) for i in range(CLIPS)]
    task = {
        "app_id": APP,
        "task_id": TASK,
        "interaction_mode": "SHADOWING",
        "listen_ratio": 1.2,
        "min_window_ms": WINDOW_MS,
        "assessment": {"enabled": False, "methods": [], "defer": True},
        "lessons": [{"lesson_id": LESSON, "clips": clips, "sentences": [f"s{c}" for c in clips]}],
    }
    path.write_text(json.dumps([task]))
    return path


def device_ids(n: int) -> list[str]:
    return [f"b0_00_00_00_{i >> 8:02x}_{i & 0xFF:02x}" for i in range(n)]


def summary(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {"count": 0}
    return {
        "count": len(samples),
        "p50_ms": round(quantile(samples, 0.5), 2),
        "p99_ms": round(quantile(samples, 0.99), 2),
        "max_ms": round(max(samples), 2),
    }


def set_nodelay(client: aiomqtt.Client | None) -> None:
    """TCP_NODELAY on an aiomqtt client's socket (paho leaves Nagle on)."""
    sock = (
        None if client is None else client._client.socket()
    )  # private attribute: bench probe only
    if isinstance(sock, socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class FirstPlayBoard(BoardSimulator):
    """A board simulator that notes the wall-clock time each clip's PLAY_MEDIA first reached it
    (a resend of the same command, same id, does not count again)."""

    plays: dict[int, float]  # clip index → first receipt, epoch ms

    def _on_command(self, payload: bytes) -> None:
        now_ms = time.time() * 1000
        if b'"PLAY_MEDIA"' in payload:
            name = json.loads(payload)["params"]["name"]
            clip = int(name.rsplit("/c", 1)[1].removesuffix(".mp3")) - 1
            self.plays.setdefault(clip, now_ms)
        super()._on_command(payload)


async def child(spec: dict[str, Any]) -> dict[str, Any]:
    host, port, devs = spec["host"], spec["port"], spec["devices"]
    durations = {f"/{APP}/{TASK}/lessons/{LESSON}/{_clip(i)}": CLIP_MS for i in range(CLIPS)}
    boards = []
    for dev, password in devs.items():
        board = FirstPlayBoard(dev, host=host, port=port, username=dev, password=password,
                           options=SimOptions(durations=durations))  # fmt: skip
        board.plays = {}
        boards.append(board)
    # dev → step index → (lateness, actual close)
    closes: dict[str, dict[int, tuple[int, int]]] = defaultdict(dict)
    refused: list[dict[str, Any]] = []
    async with (
        aiomqtt.Client(
            host,
            port,
            username=spec["backend"][0],
            password=spec["backend"][1],
            identifier="bench-backend",
        ) as client,  # fmt: skip
        asyncio.TaskGroup() as tg,
    ):
        await client.subscribe("snlpgw/v1/task/+", qos=1)
        await client.subscribe("snlpgw/v1/reply/+", qos=1)
        tasks = [tg.create_task(b.run(), name=f"bench.board[{b.dev}]") for b in boards]
        await asyncio.gather(*(b.connected.wait() for b in boards))
        if spec["nodelay"]:
            set_nodelay(client)  # the boards' asyncio sockets have TCP_NODELAY already
        for i, dev in enumerate(devs):
            req = {"v": 1, "id": f"start-{i}", "action": "start", "app_id": APP,
                   "task_id": TASK, "lesson_id": LESSON, "source": "bench"}  # fmt: skip
            await client.publish(f"snlpgw/v1/ctl/{dev}", json.dumps(req), qos=1)
        async with asyncio.timeout(CHILD_TIMEOUT_S):
            await _collect(client, len(devs), closes, refused)
        for task in tasks:
            task.cancel()
    lateness = [float(lat) for per in closes.values() for lat, _ in per.values()]
    to_play: list[float] = []
    for board in boards:
        # Close of window k is followed by the PLAY_MEDIA of clip k+1 (the last close ends it).
        for step, (_, actual) in closes[board.dev].items():
            if step + 1 in board.plays:
                to_play.append(board.plays[step + 1] - actual)
    resent = sum(b.stats["ack_duplicate"] for b in boards)
    return {"lateness": lateness, "close_to_play": to_play, "refused": refused, "resent": resent}


async def _collect(
    client: aiomqtt.Client,
    lessons: int,
    closes: dict[str, dict[int, tuple[int, int]]],
    refused: list[dict[str, Any]],
) -> None:
    ended = 0
    async for msg in client.messages:
        body = json.loads(msg.payload if isinstance(msg.payload, bytes) else b"{}")
        if "/reply/" in msg.topic.value:
            if body.get("status") != "accepted":
                refused.append(body)
                ended += 1
        elif body.get("event") == "window.closed":
            data = body["data"]
            step = body["step_index"]
            closes[body["device"]][step] = (data["lateness_ms"], data["actual_close_ms"])
        elif body.get("event") in ("instance.completed", "instance.cancelled"):
            ended += 1
        if ended >= lessons:
            return


async def run_size(n: int, variant: str, window: tuple[int, int], root: Path) -> dict[str, Any]:
    nodelay = variant == "nodelay"
    load0 = os.getloadavg()[0]
    extra = "set_tcp_nodelay true\n" if nodelay else ""
    async with local_broker(root / "data", extra_config=extra) as broker:
        devs = {d: provision(root / "data", d, reload=None).password for d in device_ids(n)}
        backend = broker.provision("bench-backend", role="backend")  # one reload for all users
        await wait_connectable(broker, backend.username, backend.password)
        settings = gateway_settings(
            broker,
            use=Use.LOAD,
            runtime={"catalog_path": write_catalog(root / "catalog.json"), "min_window_ms": 0},
            board={"max_in_flight": window[0]},
            mqtt={"max_inflight": window[1]},
        )
        spec = {"host": broker.host, "port": broker.port, "devices": devs,
                "backend": [backend.username, backend.password], "nodelay": nodelay}  # fmt: skip
        (root / "spec.json").write_text(json.dumps(spec))
        async with running_gateway(settings) as gw:
            cpu0, wall0 = time.process_time(), time.monotonic()
            child0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench.timer_bench", "--child", str(root / "spec.json"),
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            async with asyncio.timeout(CHILD_TIMEOUT_S + 30):
                out, _ = await proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"board child exited {proc.returncode}")
            cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
            child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            child_cpu = (child1.ru_utime + child1.ru_stime) - (child0.ru_utime + child0.ru_stime)
            registry = gw.service.metrics.registry
            gauge = {
                stat: registry.get_sample_value("snlpgw_window_lateness_ms", {"stat": stat})
                for stat in ("p50", "p99", "max", "count")
            }
            connects = registry.get_sample_value("snlpgw_mqtt_connects_total")
    found = json.loads(out)
    return {
        "variant": variant,
        "in_flight_board_mqtt": list(window),
        "devices": n,
        "windows_expected": n * CLIPS,
        "lateness": summary(found["lateness"]),
        "close_to_next_play": summary(found["close_to_play"]),
        "gateway_lateness_quantiles": gauge,
        "refused_starts": len(found["refused"]),
        "commands_resent_to_boards": found["resent"],
        "gateway_broker_connects": connects,
        "gateway_cpu_s": round(cpu, 2),
        "boards_process_cpu_s": round(child_cpu, 2),
        "wall_s": round(wall, 2),
        "loadavg_1m_before_after": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }


NOTES = """
All figures in ms. *Lateness* is the gateway's own measure (timer fired - planned close, wall
clock, integer ms). *close→next PLAY_MEDIA* is what a child hears as the gap: window close (the
gateway's actual close) to the first receipt of the next clip's PLAY_MEDIA at the board (a
resend does not count again). *In flight 1/1* is the old gateway: one command in flight per
board (PLAY_MEDIA waited for LISTEN_STOP's ack from the board) and one publish in flight on
its broker connection (each publish waited for the previous PUBACK, so at N boards every step's
commands and task events queued behind broker round trips). *4/20* is the pipelined default
(`board.max_in_flight`, `mqtt.max_inflight`): LISTEN_STOP and the next PLAY_MEDIA leave back
to back. *Resends* counts commands a board received again. All windows close in the same
millisecond (lessons started together, identical clips), the worst case; gateway, broker and
the boards' process share the machine's two cores, with other engineers' work (load column).
The gateway and the boards run the project's own MQTT client (asyncio sockets: TCP_NODELAY
always on; the Nagle comparison and the paho/aiomqtt runs are in timer.md's git history).
The run before it, on aiomqtt/paho, fell into a resend storm at 200 boards: 200-261 of 1,600
windows, 6,000+ resends. Ack deadlines then counted from when the board outbox decided to send,
but under overload a command waited in the gateway's MQTT outbox longer than the 3 s deadline,
so commands that had not left yet were "resent": each copy queued behind the others, each was
acked again, and the load grew with it. Deadlines now start when the command is written to the
broker socket, each resend waits twice as long as the one before, and the client costs a tenth
of the CPU per message: 1,600 of 1,600 windows, no resend, close → next PLAY_MEDIA p50 29 ms.
"""


def write_results(runs: list[dict[str, Any]]) -> None:
    doc = {
        "bench": "timer",
        "machine": f"{platform.machine()} {platform.system()} python {platform.python_version()}",
        "lesson": {"clips": CLIPS, "clip_ms": CLIP_MS, "window_ms": WINDOW_MS},
        "runs": runs,
    }
    rows = [
        "# Listen-window timer accuracy\n",
        f"N boards each run a shadowing lesson ({CLIPS} clips of {CLIP_MS} ms, {WINDOW_MS} ms "
        "windows), all started at once; gateway in-process, boards + observer in a child "
        "process, local Mosquitto. `python -m bench.timer_bench`. Budget (SPEC §2.1): ±200 ms.\n",
        "| sockets | in flight board/mqtt | boards | windows | lateness p50 | p99 | max "
        "| close→next PLAY_MEDIA p50 | p99 | max | resends | CPU s: gateway / boards / wall s "
        "| load 1m before → after |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lat, play = r["lateness"], r["close_to_next_play"]
        load = " → ".join(str(x) for x in r["loadavg_1m_before_after"])
        rows.append(
            f"| {r['variant']} | {'/'.join(map(str, r['in_flight_board_mqtt']))} | "
            f"{r['devices']} | {lat['count']}/{r['windows_expected']} | {lat['p50_ms']} | "
            f"{lat['p99_ms']} | {lat['max_ms']} | {play['p50_ms']} | {play['p99_ms']} | "
            f"{play['max_ms']} | {r['commands_resent_to_boards']} | "
            f"{r['gateway_cpu_s']} / {r['boards_process_cpu_s']} / {r['wall_s']} | {load} |"
        )
    rows.append(NOTES)
    record("timer", doc, "\n".join(rows) + "\n")


async def main_async() -> list[dict[str, Any]]:
    runs = []
    for variant, window in VARIANTS:
        for n in SIZES:
            with tempfile.TemporaryDirectory(prefix="snlpgw-timer-") as tmp:
                run = await run_size(n, variant, window, Path(tmp))
            sys.stderr.write(json.dumps(run) + "\n")
            runs.append(run)
    return runs


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        result = asyncio.run(child(json.loads(Path(sys.argv[2]).read_text())))
        sys.stdout.write(json.dumps(result))
        return 0
    write_results(asyncio.run(main_async()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
