"""Catch-up at scale: after a speaking run, how long until every shed answer has its numbers.

The lessons phase of :mod:`bench.assessment_lessons` (N shadowing lessons, every board answering
every window with real espeak-ng speech, the gateway on a CPU of its own, ``asr.engine=http``
against a fresh ``snlpgw asr-serve --workers 1``), with ``asr.catch_up_interval_s`` = 1 s. Under
the lessons the ASR queue is rarely empty, so catch-up waits; the answers shed meanwhile
(``asr_saturated``, ``queue_full``, ``voice_overload``) are archived. Once the lessons are over
and measured, the gateway is watched (its ``/metrics`` every second) until catch-up has taken up
as many steps as were shed, or ``--limit-s``: the time that took, the steps assessed per second,
and the CPU the ASR service and the gateway used for them (from /proc).

Run: ``.venv/bin/python -m bench.assessment_catch_up`` (``--cases``; a few minutes per case);
writes bench/results/assessment_catch_up.json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import functools
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.assessment_lessons import parse as lessons_args
from bench.assessment_lessons import run_case
from bench.load.procs import cpu_s, load_conditions
from bench.stats import record
from devstack.process import GatewayProcess

NAME = "assessment_catch_up"
POLL_S = 1.0


def _sum(figures: dict[str, float], prefix: str, exclude: tuple[str, ...] = ()) -> float:
    return sum(
        v for k, v in figures.items() if k.startswith(prefix) and not any(x in k for x in exclude)
    )


async def drain(asr_pids: list[int], gw: GatewayProcess, *, limit_s: float) -> dict[str, Any]:
    """Watch catch-up take up what the run shed (one query of /metrics a second)."""
    first = await asyncio.to_thread(gw.metrics)
    shed = _sum(first, "snlpgw_assessments_shed_total")
    done_before = _sum(first, "snlpgw_assessment_catch_up_total", ("yielded",))
    assessed_before = first.get("snlpgw_assessment_catch_up_total{outcome=assessed}", 0.0)
    cpu0 = {pid: cpu_s(pid) for pid in [gw.pid, *asr_pids]}
    t0 = time.monotonic()
    figures = first
    while time.monotonic() - t0 < limit_s:
        taken = _sum(figures, "snlpgw_assessment_catch_up_total", ("yielded",))
        if taken >= shed:
            break
        await asyncio.sleep(POLL_S)
        figures = await asyncio.to_thread(gw.metrics)
    wall = time.monotonic() - t0
    outcomes = {
        k.split("outcome=")[1].rstrip("}"): int(v)
        for k, v in figures.items()
        if k.startswith("snlpgw_assessment_catch_up_total")
    }
    assessed = outcomes.get("assessed", 0) - int(assessed_before)  # while watched
    asr_cpu = sum(cpu_s(pid) - cpu0[pid] for pid in asr_pids)
    return {
        "shed": int(shed),
        "taken_up_during_lessons": int(done_before),
        # of the run's published assessments, these were catch-up's (the rest were live)
        "assessed_during_lessons": int(assessed_before),
        "outcomes": outcomes,
        "assessed_while_watched": assessed,
        "drain_s": round(wall, 1),
        "complete": _sum(figures, "snlpgw_assessment_catch_up_total", ("yielded",)) >= shed,
        "assessed_per_s": round(assessed / wall, 2) if wall else 0.0,
        "asr_cpu_s": round(asr_cpu, 2),
        "assessed_per_asr_cpu_s": round(assessed / asr_cpu, 2) if asr_cpu else 0.0,
        "gateway_cpu_s": round(cpu_s(gw.pid) - cpu0[gw.pid], 2),
    }


def markdown(doc: dict[str, Any]) -> str:
    cond = doc["conditions"]
    lines = [
        "# Catch-up assessment at scale (bench/assessment_catch_up.py)",
        "",
        f"Run {doc['started']}. The lessons phase of bench/assessment_lessons.py (N shadowing "
        "lessons of 10 clips x 1500 ms, every board answering every window with real espeak-ng "
        "speech over its Xiaozhi voice session, the gateway on CPU [1] alone, `asr.engine=http` "
        "against a fresh `snlpgw asr-serve --workers 1` at nice 19 beside the broker and the "
        "boards), with `asr.catch_up_interval_s` = 1 s. After the lessons: the gateway watched "
        "until catch-up had taken up as many steps as were shed (or the limit).",
        "",
        f"Machine before the run: load average {cond['loadavg_1_5_15']}, busy share "
        f"{cond['busy_share_before_run']} ({cond['cpus']} CPUs).",
        "",
        "Columns: *assessed live* = assessments of answers heard in their window; *shed* = steps "
        "stored with `assessment_shed`; *caught up while the boards waited* = catch-up's "
        "assessments in the boards' wait for the last live ones (`drain_s` of the boards, after "
        "the last window: the ASR queue empties early in it); *while watched* = the rest, from "
        "the boards' end until every shed step was taken up (*watched s*), with the rate and "
        "ASR CPU of that part; *lessons' end → all assessed* = the boards' wait + watched s.",
        "",
        "| lessons | next-clip error p99 | answers spoken | assessed live | shed | caught up "
        "while the boards waited | while watched | failed / missing | watched s | lessons' end "
        "→ all assessed s | assessed/s (watched) | per ASR CPU-second | gateway CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in doc["cases"]:
        after = case["after"]
        out = after["outcomes"]
        lines.append(
            f"| {case['lessons']} | {case['completed_to_next_play_error_ms'].get('p99', '-')} | "
            f"{case['speech']['answers_started']} | "
            f"{case['assessments_published'] - after['assessed_during_lessons']} | "
            f"{after['shed']} | {after['assessed_during_lessons']} | "
            f"{after['assessed_while_watched']} | "
            f"{out.get('failed', 0)} / {out.get('missing', 0) + out.get('undecodable', 0)} | "
            f"{after['drain_s']}{'' if after['complete'] else ' (limit)'} | "
            f"{round(case['speech']['drain_s'] + after['drain_s'], 1)} | "
            f"{after['assessed_per_s']} | {after['assessed_per_asr_cpu_s']} | "
            f"{after['gateway_cpu_s']} |"
        )
    lines += ["", *doc["notes"]]
    return "\n".join(lines) + "\n"


async def measure(ns: list[int], limit_s: float, notes: list[str]) -> dict[str, Any]:
    args = lessons_args([])
    conditions = load_conditions()
    started = datetime.datetime.now(datetime.UTC)
    cases = []
    with tempfile.TemporaryDirectory(prefix="snlp-catch-up-") as tmp:
        for i, n in enumerate(ns):
            case = await run_case(
                (n, True, 1, 0, 1), args, Path(tmp) / str(i),
                asr_extra={"catch_up_interval_s": 1.0},
                after=functools.partial(drain, limit_s=limit_s),
            )  # fmt: skip
            cases.append(case)
    return {
        "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "conditions": conditions,
        "cases": cases,
        "notes": notes,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.assessment_catch_up")
    p.add_argument("--cases", type=lambda s: [int(x) for x in s.split(",") if x], default=[100])
    p.add_argument("--limit-s", type=float, default=600.0)
    p.add_argument("--out", type=Path, help="the JSON here and the Markdown on stdout only")
    p.add_argument("--note", action="append", default=[])
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    doc = asyncio.run(measure(args.cases, args.limit_s, args.note))
    if args.out is not None:
        args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        sys.stdout.write(markdown(doc))
        return
    record(NAME, doc, markdown(doc))


if __name__ == "__main__":
    main()
