"""Assessment at scale, the assessment side alone: ``snlpgw asr-serve`` (pocketsphinx worker
processes) fed through the gateway's own HTTP engine and bounded assessment queue by N lessons'
window closes, each bringing a real espeak-ng answer.

Per (N lessons, W ASR workers): a fresh ``asr-serve --workers W``; N lessons staggered over
one step period (clip 1500 ms + window 1800 ms, the load harness's defaults), each closing a
window every period and submitting its answer (one of five sentences, 0.9-1.9 s of speech, with
the lesson's sentences as hints) into an :class:`AsrPool` like the gateway's (queue
``--queue-limit``, oldest shed; ``2 W`` requests in flight). Measured: close → assessment
latency of the assessed answers (p50/p99), assessments/s, per ASR core, the shed share, and the
CPU the workers used against the machine's (the machine is shared: a busy share well above the
workers' own says the run met contention).

Not measured here: the lessons' next-clip gap in the same run; :mod:`bench.assessment_lessons`
runs both (its section is appended to the same Markdown). Run:
``.venv/bin/python -m bench.assessment_scale``; writes bench/results/assessment_scale.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bench.assessment_section import committed_section
from bench.load.procs import cpu_s, load_conditions, machine_busy
from bench.stats import RESULTS, record, summary
from devstack.broker import free_port
from gateway.assessment.asr_metrics import AsrMetrics
from gateway.assessment.http_engine import AsyncBackend, HttpAsrEngine
from gateway.assessment.jobs import AsrJob, AsrKey, AsrOutcome, AsrResult, audio_ms
from gateway.assessment.pool import AsrPool
from gateway.assessment.serve import PATH
from gateway.metrics import Metrics
from tests.support.speech import synthesize

ROOT = Path(__file__).resolve().parents[1]
LESSON = (
    "Good morning.",
    "How are you?",
    "I am fine, thank you.",
    "The cat is sleeping.",
    "See you later, alligator.",
)
STEP_PERIOD_S = 1.5 + 1.8  # clip + window (listen_ratio 1.2), as bench/load runs lessons


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(x) for x in text)
    return found


@contextlib.asynccontextmanager
async def asr_serve(workers: int, queue_limit: int) -> AsyncIterator[tuple[str, int]]:
    port = free_port()
    argv = [sys.executable, "-m", "gateway", "asr-serve", "--port", str(port)]
    argv += ["--workers", str(workers), "--queue-limit", str(queue_limit)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNLPGW_")}
    proc = await asyncio.to_thread(
        subprocess.Popen, argv, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True
    )

    def listening() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "asr-serve listening" in line:
                return
        raise RuntimeError("asr-serve exited")

    try:
        await asyncio.wait_for(asyncio.to_thread(listening), 120)
        yield f"http://127.0.0.1:{port}{PATH}", proc.pid
    finally:
        proc.send_signal(signal.SIGINT)
        await asyncio.to_thread(proc.communicate, timeout=60)


async def offer(
    pool: AsrPool, closes: dict[AsrKey, float], lessons: int, seconds: float, answers: list[bytes]
) -> None:
    """``lessons`` staggered over a step period, each closing a window (an answer) per period."""
    start = time.monotonic()
    gap = STEP_PERIOD_S / lessons
    n = 0
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed / gap) + 1
        while n < due:  # the windows that closed since the last tick
            lesson, step = n % lessons, n // lessons
            key = AsrKey(f"l{lesson}", step, "u")
            closes[key] = time.monotonic()
            pool.submit(AsrJob(key, answers[(lesson + step) % len(answers)], LESSON))
            n += 1
        await asyncio.sleep(min(gap, 0.01))


async def run_case(
    lessons: int, workers: int, *, seconds: float, queue_limit: int, answers: list[bytes]
) -> dict[str, Any]:
    closes: dict[AsrKey, float] = {}
    latencies: list[float] = []
    failures: list[str] = []
    shed = 0
    done_at: list[float] = []
    drained = asyncio.Event()

    def settled() -> None:
        if len(latencies) + len(failures) + shed >= len(closes) and stopped:
            drained.set()

    def on_result(outcome: AsrOutcome) -> None:
        closed = closes[outcome.key]
        if isinstance(outcome.result, AsrResult):
            latencies.append((time.monotonic() - closed) * 1000)
            done_at.append(time.monotonic())
        else:
            failures.append(outcome.result.reason.value)
        settled()

    def on_drop(job: AsrJob) -> None:
        nonlocal shed
        shed += 1
        settled()

    stopped = False
    async with asr_serve(workers, queue_limit=4 * workers) as (url, pid):
        engine = HttpAsrEngine(url=url, model="pocketsphinx", timeout_s=60, retries=2)
        pool = AsrPool(
            backend=AsyncBackend(engine),
            metrics=AsrMetrics(Metrics()),
            on_result=on_result,
            on_drop=on_drop,
            workers=2 * workers,
            queue_limit=queue_limit,
            job_timeout_s=60,
        )
        async with asyncio.TaskGroup() as tg:
            running = tg.create_task(pool.run(), name="bench.pool")
            for _ in range(2 * workers):  # warm: every worker started, the lesson LM built
                warm = await engine.transcribe(answers[0], LESSON)
                assert isinstance(warm, AsrResult), warm
            procs = [pid, *_children(pid)]
            cpu0, busy0 = sum(cpu_s(p) for p in procs), machine_busy()
            start = time.monotonic()
            await offer(pool, closes, lessons, seconds, answers)
            stopped = True
            settled()
            async with asyncio.timeout(120):
                await drained.wait()
            wall = time.monotonic() - start
            cpu1, busy1 = sum(cpu_s(p) for p in procs), machine_busy()
            running.cancel()
    cores = os.cpu_count() or 1
    machine_cpu_s = (busy1[0] - busy0[0]) / max(1.0, busy1[1] - busy0[1]) * wall * cores
    assessed = len(latencies)
    return {
        "lessons": lessons,
        "asr_workers": workers,
        "offered_per_s": round(lessons / STEP_PERIOD_S, 1),
        "answers": len(closes),
        "assessed": assessed,
        "shed": shed,
        "failed": len(failures),
        "shed_share": round(shed / max(1, len(closes)), 3),
        "close_to_assessment_ms": summary(latencies),
        "assessments_per_s": round(assessed / wall, 2),
        "assessments_per_s_per_core": round(assessed / wall / workers, 2),
        # contention-free: what one core gives when the workers have it (CPU they really got)
        "assessments_per_asr_cpu_s": round(assessed / max(0.1, cpu1 - cpu0), 2),
        "wall_s": round(wall, 1),
        "asr_cpu_s": round(cpu1 - cpu0, 1),
        "machine_cpu_s": round(machine_cpu_s, 1),
    }


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        "# Assessment at scale (bench/assessment_scale.py)",
        "",
        "`snlpgw asr-serve` (pocketsphinx, lesson LM) fed through the gateway's HTTP engine and",
        f"bounded assessment queue ({doc['queue_limit']}, oldest shed) by N lessons closing a",
        f"window every {STEP_PERIOD_S:.1f} s each, staggered, every answer real espeak-ng speech",
        f"({doc['answer_ms']} ms of audio). {doc['seconds']:.0f} s of closes per case, then drained.",
        "",
        f"Machine: {doc['conditions']['cpus']} CPUs **shared with other developers' work**; "
        f"before the run: load average {doc['conditions']['loadavg_1_5_15']}, busy share "
        f"{doc['conditions']['busy_share_before_run']}. `machine CPU` beside `ASR CPU` shows "
        "what else ran during each case.",
        "",
        "| lessons | ASR workers | offered /s | assessed | shed | close→assessment p50 | p99 "
        "| assessments/s | per ASR core | per ASR CPU-second | ASR CPU s | machine CPU s "
        "| wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in doc["cases"]:
        lat = c["close_to_assessment_ms"]
        lines.append(
            f"| {c['lessons']} | {c['asr_workers']} | {c['offered_per_s']} | {c['assessed']} "
            f"| {c['shed']} ({c['shed_share']:.0%}) | {lat.get('p50', '-')} ms "
            f"| {lat.get('p99', '-')} ms | {c['assessments_per_s']} "
            f"| {c['assessments_per_s_per_core']} | {c['assessments_per_asr_cpu_s']} "
            f"| {c['asr_cpu_s']} | {c['machine_cpu_s']} "
            f"| {c['wall_s']} |"
        )
    for note in doc["notes"]:
        lines += ["", note]
    if lessons := committed_section():
        lines += ["", *lessons]
    lines.append("")
    return "\n".join(lines)


def rewrite() -> None:
    """Re-render the committed JSON (after a format change) without re-running."""
    doc = json.loads((RESULTS / "assessment_scale.json").read_text(encoding="utf-8"))
    for c in doc["cases"]:
        c.setdefault(
            "assessments_per_asr_cpu_s", round(c["assessed"] / max(0.1, c["asr_cpu_s"]), 2)
        )
    record("assessment_scale", doc, markdown(doc))


async def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.assessment_scale")
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    p.add_argument("--lessons", type=ints, default=[200, 1000])
    p.add_argument("--workers", type=ints, default=[1, 2])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--queue-limit", type=int, default=32)
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--rewrite", action="store_true", help="re-render the committed JSON")
    args = p.parse_args(argv)
    if args.rewrite:
        rewrite()
        return
    logging.getLogger("gateway.assessment.pool").setLevel(logging.ERROR)  # a line per shed job
    answers = [synthesize(s) for s in LESSON]
    conditions = load_conditions()
    cases = []
    for lessons in args.lessons:
        for workers in args.workers:
            case = await run_case(
                lessons, workers, seconds=args.seconds, queue_limit=args.queue_limit,
                answers=answers,
            )  # fmt: skip
            cases.append(case)
            sys.stderr.write(f"{case}\n")
    doc = {
        "conditions": conditions,
        "seconds": args.seconds,
        "queue_limit": args.queue_limit,
        "answer_ms": [round(audio_ms(a)) for a in answers],
        "cases": cases,
        "notes": [
            "Not in this run: the lessons' next-clip p99 (this bench feeds asr-serve without "
            "lessons). The section below (bench/assessment_lessons.py) runs the lessons, their "
            "boards' spoken answers and assessment in one run.",
        ],
    }
    text = markdown(doc)
    if args.no_write:
        sys.stdout.write(text + "\n")
    else:
        record("assessment_scale", doc, text)


if __name__ == "__main__":
    asyncio.run(main())
