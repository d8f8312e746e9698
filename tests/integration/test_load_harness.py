"""The load harness (bench/load) end to end at tiny sizes: it runs, stops by itself, and writes
the result files with the structure the README and plots rely on. No figure is judged here
(timings are the benchmark's business, recorded under bench/results/load/)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.load.procs import descendants, harness_on, place_gateway, place_gateways

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(600)
def test_quick_run_writes_json_markdown_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "load"
    done = subprocess.run(
        [sys.executable, "-m", "bench.load", "--quick", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((out / "load.json").read_text())
    assert doc["failed"] == [], (doc["failed"], done.stderr[-3000:])  # say why a run failed

    (lessons_staggered, lessons_simultaneous) = doc["lessons"]
    assert {lessons_staggered["start"], lessons_simultaneous["start"]} == {
        "staggered",
        "simultaneous",
    }
    for run in doc["lessons"]:
        assert run["lessons"] == 5
        assert run["lessons_completed"] == 5
        assert run["refused_starts"] == 0
        # 2 clips: one completed → next PLAY_MEDIA per lesson, one last window per lesson.
        assert run["steps_measured"] == run["steps_expected"] == 5
        assert run["completed_to_next_play_error_ms"]["count"] == 5
        assert run["last_window_to_listen_stop_error_ms"]["count"] == 5
        assert {"p50", "p99", "max"} <= run["completed_to_next_play_error_ms"].keys()
        assert run["gateway_cpu_s"] > 0
        assert "samples_ms" not in run
        # The window's LISTEN_START came for every step, well within its window.
        opened = run["completed_to_listen_start_ms"]
        assert opened["count"] == 5
        assert run["listen_start_missing"] == 0
        assert 0 < opened["min"] <= opened["max"] < run["window_ms"]
        # The broker probe answered all along (every 20 ms over a run of seconds).
        assert run["broker_probe_error"] is None
        assert run["sampler_errors"] == []
        assert run["broker_round_trip_ms"]["count"] >= 50
        assert {"gateway_process_cpu_max", "others_cpus_busy_max", "steal_max"} <= set(
            run["worst_seconds"][0]
        )
        assert isinstance(run["broker_stalls"], list)

    hellos = doc["hellos"]
    assert hellos["sessions"] == 5
    assert hellos["staggered"]["hellos"] == 10
    assert hellos["burst"]["hellos"] == 5
    assert hellos["staggered"]["no_reply"] == hellos["burst"]["no_reply"] == 0

    stream = doc["stream"]
    (run,) = stream["runs"]
    assert run["sessions_opened"] == 5
    assert run["frames_decoded_in_window"] > 0
    assert stream["floor"]["sessions_per_core"] > 0
    assert stream["ratio_to_floor"] > 0
    # The floor measured on the gateway's thread in the run's window (bench/load/floor.py),
    # its CPU taken out of the gateway's.
    assert run["thread_floor"]["ticks"] > 0
    assert run["thread_floor"]["us_per_frame_mean"] > 0
    assert run["thread_ratio"] > 0
    assert run["floor_ticks_cpu_s"] == run["thread_floor"]["cpu_s"] > 0

    placements = [r["placement"] for r in (*doc["lessons"], hellos)]
    if len(os.sched_getaffinity(0)) > 1:  # the gateway on a CPU of its own in both phases
        for where in placements:
            assert where["gateway_cpus"]
            assert not set(where["gateway_cpus"]) & set(where["others_cpus"])

    assert doc["host"]["python_workload_ms"] > 0

    text = (out / "load.md").read_text()
    assert "floor on its thread" in text
    assert "broker round trip" in text
    for heading in ("## Streaming", "## Lessons", "## Xiaozhi hello"):
        assert heading in text
    for png in ("latency_cdf.png", "cpu_vs_n.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nothing to place")
def test_place_gateway_moves_every_thread_and_harness_on_moves_the_harness_and_back() -> None:
    code = "import threading, sys; threading.Thread(target=sys.stdin.read).start(); print(1, flush=True); sys.stdin.read()"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        for _ in range(2)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            proc.stdout.readline()  # both threads are running
        mine = os.sched_getaffinity(0)
        where = place_gateway(procs[0].pid, [procs[1].pid])
        for proc, cpus in zip(procs, (where["gateway_cpus"], where["others_cpus"]), strict=True):
            tids = os.listdir(f"/proc/{proc.pid}/task")
            assert len(tids) == 2
            assert all(os.sched_getaffinity(int(t)) == set(cpus) for t in tids)
        assert os.sched_getaffinity(0) == mine
        # While a placed run measures, the harness goes with the others, and comes back after.
        with harness_on(where):
            assert os.sched_getaffinity(0) == set(where["others_cpus"])
        assert os.sched_getaffinity(0) == mine
        shared = place_gateway(procs[0].pid, [], on=False)
        assert shared["gateway_cpus"] == "shared"
        with harness_on(shared):
            assert os.sched_getaffinity(0) == mine
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()  # reaps it and closes its pipes


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nothing to place")
def test_place_gateways_gives_each_gateway_a_cpu_only_when_one_is_left_over() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    code = "import sys; print(1, flush=True); sys.stdin.read()"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        for _ in range(len(cpus) + 1)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            proc.stdout.readline()
        # As many gateways as CPUs: nothing left for the rest, so nothing moves.
        gateways, rest = [p.pid for p in procs[: len(cpus)]], [procs[-1].pid]
        assert place_gateways(gateways, rest)["gateway_cpus"] == "shared"
        assert all(os.sched_getaffinity(pid) == set(cpus) for pid in [*gateways, *rest])
        # One gateway fewer than CPUs: each on a CPU of its own (the plan: tests/unit), the
        # rest on the one left.
        where = place_gateways(gateways[:-1], rest)
        assert isinstance(where["gateway_cpus"], list)
        for pid, cpu in zip(gateways, where["gateway_cpus"], strict=False):
            assert os.sched_getaffinity(pid) == {cpu}
        assert os.sched_getaffinity(rest[0]) == set(where["others_cpus"]) == {cpus[0]}
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()


def _names(pids: list[int]) -> list[str]:
    names = []
    for pid in pids:
        with contextlib.suppress(FileNotFoundError):
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
    return names


def test_descendants_finds_children_and_grandchildren() -> None:
    # a shell whose child shell starts a sleep: three levels, as postgres and its backends
    tree = subprocess.Popen(["sh", "-c", "sh -c 'sleep 30 & wait' & wait"])
    try:
        # the shells fork and exec on their own time: a forked child is named "sh" until it
        # has exec'd sleep (CI once read ["sh", "sh"] here), so both are polled, up to 30 s
        deadline = time.monotonic() + 30
        while True:
            names = sorted(_names(descendants(tree.pid)))
            if names == ["sh", "sleep"] or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert names == ["sh", "sleep"]
    finally:
        for pid in [*descendants(tree.pid), tree.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        tree.wait()
