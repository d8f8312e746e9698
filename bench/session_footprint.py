"""What one open Xiaozhi session with CHAT costs the garbage collector (issue 12: hello p99).

Run from the repo root: ``python -m bench.session_footprint [note]``. In-process, no broker and
no sockets (as ``bench.hello_core_bench``): the Xiaozhi channel with the CHAT component running
(embedded engine), 1,000 devices say hello and keep their sessions open. Reports the GC-tracked
objects per open session (``gc.get_objects()`` after ``gc.collect()``, minus the count before the
hellos, over N), the largest per-session types, and the time of one full collection
(``gc.collect()``, generation 2) with those sessions open: a full collection walks every tracked
object, and one of them landing in a hello is that hello's tail latency.
Writes bench/results/session_footprint.json and session_footprint.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from types import SimpleNamespace
from typing import Any, cast

from bench.hello_core_bench import SilentTransport, bench_settings, hello_messages
from bench.stats import RESULTS, quantile, record
from gateway.chat.component import ChatComponent
from gateway.metrics import Metrics
from gateway.service import Context
from gateway.xiaozhi.channel import XiaozhiChannel
from gateway.xiaozhi.live import NullVoice
from tests.support.fake_mqtt import FakePublisher

SESSIONS = 1000
COLLECTIONS = 15


def census() -> Counter[str]:
    return Counter(type(o).__qualname__ for o in gc.get_objects())


def collections() -> tuple[list[float], list[float]]:
    """Wall and CPU ms of COLLECTIONS full collections."""
    pauses, cpus = [], []
    for _ in range(COLLECTIONS):
        t0, c0 = time.perf_counter(), time.process_time()
        gc.collect()
        pauses.append((time.perf_counter() - t0) * 1000)
        cpus.append((time.process_time() - c0) * 1000)
    return pauses, cpus


async def measure(*, freeze: bool = False) -> dict[str, Any]:
    """``freeze``: the start-up heap frozen before the hellos, as the service does
    (``ops.gc_freeze``): a full collection walks what the sessions added, and little else."""
    mqtt = FakePublisher()
    metrics = Metrics()
    settings = bench_settings(SESSIONS)
    ops = SimpleNamespace(alarm=lambda *a, **k: None)
    ctx = cast(Context, SimpleNamespace(ops=ops, metrics=metrics))
    chat = ChatComponent(
        ctx=ctx, settings=settings.chat, inner=NullVoice(), asr=None, start_task=None
    )
    channel = XiaozhiChannel(
        settings=settings,
        mqtt=mqtt,
        metrics=metrics,
        http=None,
        admin=None,
        voice=chat,
        events=chat,
        uplink_tap=chat.uplink,
        listening_by_default=False,
    )
    runner = asyncio.create_task(chat.run(), name="bench.chat")
    await chat.wait_ready()
    channel.udp_endpoint.connection_made(SilentTransport())
    channel.bound()
    ((_, handle, _),) = mqtt.routes
    messages = hello_messages(SESSIONS)
    devs = [msg.topic.removeprefix("device-server/") for msg in messages]
    for _ in range(3):
        await asyncio.sleep(0)
    gc.collect()
    before = census()
    empty = collections()[0]
    if freeze:
        gc.freeze()
    for msg in messages:
        handle(msg)
    for _ in range(3):  # whatever the sessions start runs its first step
        await asyncio.sleep(0)
    assert len(channel.core) == SESSIONS
    assert all(chat.device(dev) is not None for dev in devs)
    gc.collect()
    after = census()
    walked = len(gc.get_objects())  # the permanent (frozen) generation is not in it
    pauses, cpus = collections()
    gc.unfreeze()
    delta = after - before
    runner.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await runner
    return {
        "walked_by_a_full_collection": walked,
        "tracked_total": sum(after.values()),
        "tracked_before_hellos": sum(before.values()),
        "per_session": round((sum(after.values()) - sum(before.values())) / SESSIONS, 1),
        "top_types_per_session": {
            name: round(n / SESSIONS, 2) for name, n in delta.most_common(30) if n >= SESSIONS
        },
        "gc_collect_ms": {
            "p50": round(quantile(pauses, 0.5), 1),
            "min": round(min(pauses), 1),
            "max": round(max(pauses), 1),
            "cpu_p50": round(quantile(cpus, 0.5), 1),
            "before_hellos_p50": round(quantile(empty, 0.5), 1),
        },
    }


def commit() -> str:
    if os.environ.get("BENCH_COMMIT"):  # a scratch export (no .git) of the code measured
        return os.environ["BENCH_COMMIT"]
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return out.stdout.strip() or "unknown"


def run(label: str) -> dict[str, Any]:
    result = asyncio.run(measure())
    frozen = asyncio.run(measure(freeze=True))
    return {
        "benchmark": "GC-tracked objects per open Xiaozhi+CHAT session, and one full "
        f"gc.collect() at {SESSIONS} open sessions (in-process, no broker)",
        "sessions_open": SESSIONS,
        "label": label,
        "commit": commit(),
        **result,
        "startup_frozen": {
            "walked_by_a_full_collection": frozen["walked_by_a_full_collection"],
            "gc_collect_ms": frozen["gc_collect_ms"],
        },
        "machine": {"python": platform.python_version(), "cpu": platform.machine()},
    }


def markdown(runs: list[dict[str, Any]], note: str) -> str:
    lines = [
        "# Session footprint: what the garbage collector walks per open session",
        "",
        f"{runs[0]['benchmark']}. `python -m bench.session_footprint`.",
        "",
        "Full collection: `gc.collect()` with 1,000 sessions open; as the service runs (start-up "
        "heap frozen first, `ops.gc_freeze`) and with nothing frozen. Wall ms p50 (min-max) and "
        "CPU ms p50 of 15 collections.",
        "",
        "| code | tracked objects | per open session | frozen start-up: walked objects "
        "| frozen: wall p50 (min-max) | frozen: CPU p50 | nothing frozen: wall p50 (min-max) "
        "| nothing frozen: CPU p50 | empty heap (no session): wall p50 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        gcm, fz = r["gc_collect_ms"], r["startup_frozen"]
        fzm = fz["gc_collect_ms"]
        lines.append(
            f"| {r['label']} ({r['commit']}) | {r['tracked_total']} | {r['per_session']} "
            f"| {fz['walked_by_a_full_collection']} | {fzm['p50']} ({fzm['min']}-{fzm['max']}) "
            f"| {fzm['cpu_p50']} | {gcm['p50']} ({gcm['min']}-{gcm['max']}) | {gcm['cpu_p50']} "
            f"| {gcm['before_hellos_p50']} |"
        )
    lines += ["", "Largest per-session types (objects per open session):", ""]
    for r in {r["label"]: r for r in runs}.values():
        types = ", ".join(f"{k} {v:g}" for k, v in r["top_types_per_session"].items())
        lines.append(f"- {r['label']}: {types}")
    lines += ["", note, ""]
    return "\n".join(lines)


def main() -> None:
    """``python -m bench.session_footprint LABEL [NOTE…]``: measures this checkout and adds
    the run to the ones already recorded (alternate before/after runs; delete the JSON to start
    a new series)."""
    label = sys.argv[1] if len(sys.argv) > 1 else "this checkout"
    note = " ".join(sys.argv[2:]) or "Machine shared with other work while measured."
    result = run(label)
    path = RESULTS / "session_footprint.json"
    runs = json.loads(path.read_text()).get("runs", []) if path.exists() else []
    runs = [*runs, result]
    record("session_footprint", {"runs": runs}, markdown(runs, note))


if __name__ == "__main__":
    main()
