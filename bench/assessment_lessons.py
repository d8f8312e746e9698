"""Assessment at scale with the lessons running: one run carries both figures.

Per N (200, then 1,000): the load harness's lessons phase (:func:`bench.load.lessons.run`:
Mosquitto, the gateway in its own process on a CPU of its own, N shadowing lessons on board
simulators in worker processes, staggered over one step) with **assessment on**: the catalog's
lesson has sentences and ``text_similarity_v0``, the gateway's ASR engine is ``http`` against a
fresh ``snlpgw asr-serve --workers 1`` process, and every board answers every listen window with
real espeak-ng speech over its own Xiaozhi voice session (:mod:`bench.load.speaking`: encrypted
UDP Opus, pre-synthesized and pre-encoded once, sealed per packet at send time). Measured in the
same run:

* the lessons' next-clip error (audio.completed → next PLAY_MEDIA - window, at the boards), the
  figure the clock-stepped lessons are held to (p99 ≤ 50 ms);
* close → assessment (window close → the step's assessment received by a backend client), p50/p99
  of what is assessed; the shed count and share (the gateway's ``assessments_shed_total``: steps
  stored with ``assessment_shed``);
* assessments/s and per ASR CPU-second (the asr-serve process and its worker, from /proc).

Why asr-serve and not the embedded pool: the embedded pool's pocketsphinx processes are the
gateway's children and would start on the gateway's CPU (the harness gives the gateway a CPU of
its own: the latency target is per gateway core); asr-serve is a process of its own, placed with
the broker and the board workers, as it would run on another host in production, and its CPU is
metered apart. One worker: two cores, and the gateway has one of them.

Run: ``.venv/bin/python -m bench.assessment_lessons`` (about 2 minutes per case; ``--cases``); writes
bench/results/assessment_lessons.json and re-renders bench/results/assessment_scale.md (its
section "With the lessons running").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import functools
import json
import logging
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.assessment_scale import _children, asr_serve
from bench.assessment_scale import rewrite as rewrite_scale
from bench.assessment_section import NAME, section
from bench.load import lessons
from bench.load.procs import load_conditions
from bench.stats import RESULTS
from devstack.process import GatewayProcess
from gateway.assessment.http_engine import HttpAsrEngine
from gateway.assessment.jobs import AsrResult
from gateway.chat import espeak as audio

# Short answers (0.6-0.9 s of speech): lead + speech + tail fits the 1.8 s window of a 1.5 s clip.
SENTENCES = ["Good morning.", "How are you?", "Thank you.", "I like apples.", "See you later."]
LEAD_MS, TAIL_MS = 150, 450  # the child's reaction; silence for the VAD's 300 ms end


def lowest_priority(pid: int, nice: int = 19) -> None:
    """Every thread of ``pid`` at ``nice`` (a worker it starts later inherits it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)


Case = tuple[int, bool, int, int, int]  # lessons, archive, speak every K, links, gateways


def parse_case(text: str) -> Case:
    """``N[:on|off][/K][+L][xG]``: N lessons, the archive on (default) or off, every board
    speaking in one window of K (default 1: every window; board i speaks when (i + clip) % K ==
    0), each gateway with L publish links (``mqtt.publish_links``, default 0), G gateway
    processes sharing the devices (default 1; more: a cluster on one PostgreSQL)."""
    text, _, shards = text.partition("x")
    text, _, links = text.partition("+")
    head, _, every = text.partition("/")
    n, _, archive = head.partition(":")
    if archive not in ("", "on", "off"):
        raise argparse.ArgumentTypeError(f"archive must be on or off: {text!r}")
    return int(n), archive != "off", int(every or 1), int(links or 0), int(shards or 1)


async def run_case(
    case: Case,
    args: argparse.Namespace,
    root: Path,
    *,
    asr_extra: dict[str, Any] | None = None,
    after: Callable[[list[int], GatewayProcess], Awaitable[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """One case; ``asr_extra``: asr settings over the case's, ``after``: run with the gateway
    and the ASR service's pids once the lessons are measured (bench.assessment_catch_up)."""
    n, archive, every, links, shards = case
    async with asr_serve(1, queue_limit=4) as (url, pid):
        engine = HttpAsrEngine(url=url, model="pocketsphinx", timeout_s=60, retries=0)
        warm = await engine.transcribe(audio.synthesize(SENTENCES[0]), tuple(SENTENCES))
        assert isinstance(warm, AsrResult), warm  # the worker up, the lesson LM built
        await engine.aclose()
        asr_pids = [pid, *_children(pid)]
        for asr in asr_pids:  # it stands in for another host: below the broker and the boards
            lowest_priority(asr, args.asr_nice)
        settings: dict[str, Any] = {
            "archive": {"enabled": archive},
            "mqtt": {"publish_links": links},
            "asr": {"engine": "http", "http_url": url, "http_model": "pocketsphinx",
                    "http_timeout_s": 60.0, "http_retries": 0, "workers": 2,
                    "queue_limit": args.queue_limit, "job_timeout_s": 60.0,
                    **(asr_extra or {})},
        }  # fmt: skip
        speech = {"sentences": SENTENCES, "lead_ms": LEAD_MS, "tail_ms": TAIL_MS,
                  "quiet_s": 10.0, "drain_s": 60.0, "every": every}  # fmt: skip
        result = await lessons.run(
            n, "staggered", root / f"n{n}", clips=args.clips, clip_ms=1500,
            worker_count=args.board_workers, settings=settings, speech=speech, asr_pids=asr_pids,
            profile=args.profile and args.profile.with_suffix(f".n{n}.txt"),
            after=None if after is None else functools.partial(after, asr_pids),
            gateways=shards,
        )  # fmt: skip
    result.pop("samples_ms", None)
    result["asr_workers"] = 1
    result["archive"] = "on" if archive else "off"
    result["speak_every"] = every
    result["publish_links"] = links
    result["offered_per_s"] = round(
        result["speech"]["answers_started"] / max(0.1, result["wall_s"]), 1
    )
    return result


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.assessment_lessons")
    p.add_argument(
        "--cases",
        type=lambda s: [parse_case(x) for x in s.split(",") if x],
        default=[(200, True, 1, 0, 1), (1000, True, 1, 0, 1), (1000, True, 1, 3, 1)],
        help="N[:on|off][/K][+L][xG] each: N lessons, the answer archive on (default) or off, "
        "each board speaking in one window of K (default: every window), L publish links "
        "(default 0), G gateway processes (default 1; more: a cluster on one PostgreSQL), e.g. "
        "200,1000,1000+3,1000/5,1000x2",
    )
    p.add_argument("--clips", type=int, default=10)
    p.add_argument(
        "--asr-nice",
        type=int,
        default=19,
        help="niceness of asr-serve (19: below the broker and the boards that measure; the "
        "test uses 0, since a CPU hog on a busy CI machine leaves nice 19 nothing)",
    )
    p.add_argument("--queue-limit", type=int, default=32)
    p.add_argument(
        "--board-workers", type=int, default=2, help="board worker processes (all on CPU 0)"
    )
    p.add_argument(
        "--out", type=Path, help="the JSON here, the section on stdout; the results untouched"
    )
    p.add_argument("--profile", type=Path, help="py-spy collapsed stacks of the gateway here")
    p.add_argument("--note", action="append", default=[], help="a note for the results")
    return p.parse_args(argv)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    conditions = load_conditions()
    started = datetime.datetime.now(datetime.UTC)
    cases = []
    with tempfile.TemporaryDirectory(prefix="snlp-assess-lessons-") as tmp:
        for i, spec in enumerate(args.cases):
            case = await run_case(spec, args, Path(tmp) / str(i))
            cases.append(case)
            brief = {k: case[k] for k in ("lessons", "archive", "completed_to_next_play_error_ms",
                                          "close_to_assessment_ms", "utterances_heard",
                                          "assessments_published", "assessments_shed",
                                          "asr_cpu_s")}  # fmt: skip
            sys.stderr.write(f"{json.dumps(brief)}\n")
    return {
        "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "conditions": conditions,
        "clips": args.clips,
        "lead_ms": LEAD_MS,
        "tail_ms": TAIL_MS,
        "queue_limit": args.queue_limit,
        "answer_ms": cases[0]["speech"]["answer_ms"],
        "cases": cases,
        "notes": args.note,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING)
    doc = asyncio.run(measure(args))
    text = json.dumps(doc, indent=2) + "\n"
    if args.out is not None:
        sys.stdout.write("\n".join(section(doc)) + "\n")
        args.out.write_text(text, encoding="utf-8")
        return
    (RESULTS / f"{NAME}.json").write_text(text, encoding="utf-8")
    rewrite_scale()


if __name__ == "__main__":
    main()
