"""Inline assessment budget (issue #27 item 3): listen end → first feedback audio at the device,
with the embedded engines, at N concurrent arithmetic tasks (STEPS, inline assessment).

Run from the repo root: ``.venv/bin/python -m bench.inline_budget [--cases 1:10,50:4,200:3]``
(N:rounds[:staggered|burst]). Per case, each in its own process: a fresh local Mosquitto
(devstack); the composed gateway (:mod:`bench.inline_gateway`: ``devstack.process``'s gateway
with its embedded engines, a pocketsphinx pool of ``ASR_WORKERS`` processes and espeak-ng
SPEAK, warmed up before it says it serves: one transcription per ASR worker and, unless
``--no-presynth``, the catalog's phrases prepared in the phrase cache); and the N devices in
``--device-workers`` worker processes (:mod:`bench.inline_devices`), each device a board
simulator (MQTT) plus a Xiaozhi device simulator (MQTT + AES-CTR UDP) on the same broker
account. Every device runs ``arithmetic_10`` (cut to the case's rounds) and answers each
question ``--reaction-ms`` after it was said (a child's reaction; the question's ``tts stop``
opens the window) with pre-synthesized espeak-ng speech ("it is seven": each answer
synthesized once, Opus-encoded once, reused) followed by ``TAIL_MS`` of silence, streamed in
real time (one 60 ms packet per 60 ms).

Measured per answered round, on one wall clock (``time.time()``, one machine, every process):

* ``from_listen_end``: the gateway's listen end (``window.closed.actual_close_ms``, stamped
  when the VAD's segment end or the window timeout closes the listen window) → the first Opus
  frame of the feedback phrase received and decrypted at the device. The primary figure: what
  the budget names.
* ``from_last_packet``: the device's last answer packet sent → that same frame. This includes
  nothing the gateway did before the end of the tail (the VAD's segment end needs silence, so
  it normally lies inside the tail: this figure can be smaller than the first one, or negative
  when the feedback arrives before the tail was sent).

A round "got the neutral line" when the feedback's ``sentence_start`` text is the exercise's
neutral line (ASR dropped, failed or slower than the interpreter's ``ASR_TIMEOUT_MS``). CPU per
case, from /proc, from the go to the last device's report: the gateway process, its ASR worker
processes (its live children), its reaped children (espeak-ng and sox runs of SPEAK), the
device workers (each its own ``process_time``), Mosquitto, and the whole machine's busy share
(shared with other users: see the load average). Writes bench/results/inline_budget.json and
.md (or ``--out DIR``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.inline_devices import TASK, AnsweredRound
from bench.inline_gateway import WARM_UP_TIMEOUT_S
from bench.load.lessons import provision_all, wait_accepted
from bench.load.stack import split, workers
from bench.stats import RESULTS, quantile
from devstack.broker import local_broker
from devstack.gateway import Use, gateway_sections
from devstack.process import GatewayProcess
from gateway.tasks.core.steps import GeneratorDef
from gateway.tasks.dsl.exercises import make_exercise
from gateway.tasks.dsl.interpreter import ASR_TIMEOUT_MS
from gateway.xiaozhi.ota.trust import Binding
from gateway.xiaozhi.ota.trust_store import bindings_path, save_bindings

REPO = Path(__file__).resolve().parents[1]
TAIL_MS = 700  # silence after the answer: the VAD closes the segment inside it
ASR_WORKERS = 2  # the machine has 2 cores
BUDGET_MS = 1500.0
REACTION_MS = 600  # the child answers this long after the question was said (default)
DEVICE_WORKERS = 2  # processes the devices are dealt into
START_LEAD_S = 1.0  # go → the first start (every worker has read its go)
# (N, rounds, start pattern): ``staggered`` spreads the starts evenly over one round period
# (the usual case: children do not press start in the same second), ``burst`` starts them all
# at once (every answer of a round ends within the same second or two: the worst case).
CASES = (
    (1, 10, "staggered"),
    (50, 4, "staggered"),
    (200, 3, "staggered"),
    (50, 4, "burst"),
    (200, 3, "burst"),
)
ROUND_PERIOD_S = 6.0  # question + answer + feedback, measured at N=1
ROUND_WAIT_S = 60.0  # a device gives up on a round after this (bench.inline_devices)


def device_ids(n: int) -> list[str]:
    return [f"c7_00_00_00_{i >> 8:02x}_{i & 0xFF:02x}" for i in range(n)]


def neutral_text() -> str:
    return make_exercise(GeneratorDef(kind=TASK), 0).neutral()


def write_catalog(root: Path, rounds: int) -> Path:
    """The shipped catalog with the arithmetic task cut to ``rounds`` questions."""
    target = root / "catalog"
    shutil.copytree(REPO / "catalog", target)
    file = target / "thinking_games.json"
    tasks = json.loads(file.read_text(encoding="utf-8"))
    for task in tasks:
        for step in task["steps"]:
            if step["type"] == "generate":
                step["rounds"] = rounds
    file.write_text(json.dumps(tasks, ensure_ascii=False), encoding="utf-8")
    return target


# -- CPU from /proc ---------------------------------------------------------------------------
TICK = os.sysconf("SC_CLK_TCK")
SPEAK_COMMANDS = frozenset({"espeak-ng", "sox"})  # SPEAK's short-lived children


def proc_stat(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def proc_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` (0 when it is gone)."""
    fields = proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICK if fields else 0.0


def reaped_cpu_s(pid: int) -> float:
    """cutime + cstime of ``pid``: its children that ended and were waited for."""
    fields = proc_stat(pid)
    return (int(fields[13]) + int(fields[14])) / TICK if fields else 0.0


def children(pid: int) -> list[int]:
    """``pid``'s live children, SPEAK's short-lived espeak-ng/sox runs left out (they are in
    :func:`reaped_cpu_s` once they end)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
    keep = []
    for child in out:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{child}/comm").read_text().strip() not in SPEAK_COMMANDS:
                keep.append(child)
    return keep


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return float(sum(values[:8]) - idle), float(sum(values[:8]))


@dataclass
class InlineCpuMeter:
    """CPU by process group between :meth:`begin` and :meth:`end`: the gateway, its ASR
    workers (live children: one that ended meanwhile shows in the reaped figure), its reaped
    children (SPEAK's espeak-ng and sox), the broker, and the machine."""

    gateway_pid: int
    broker_pid: int
    start: dict[str, Any] = field(default_factory=dict)

    def read(self) -> dict[str, Any]:
        busy, total = machine_busy()
        return {
            "wall": time.monotonic(),
            "gateway": proc_cpu_s(self.gateway_pid),
            "reaped": reaped_cpu_s(self.gateway_pid),
            "workers": {pid: proc_cpu_s(pid) for pid in children(self.gateway_pid)},
            "broker": proc_cpu_s(self.broker_pid),
            "busy": busy,
            "total": total,
        }

    def begin(self) -> None:
        self.start = self.read()

    def end(self, device_workers_cpu_s: float) -> dict[str, float]:
        now, s = self.read(), self.start
        wall = now["wall"] - s["wall"]
        asr = sum(cpu - s["workers"].get(pid, 0.0) for pid, cpu in now["workers"].items())
        return {
            "wall_s": round(wall, 1),
            "gateway_cpu_s": round(now["gateway"] - s["gateway"], 1),
            "asr_workers_cpu_s": round(asr, 1),
            "speak_subprocesses_cpu_s": round(now["reaped"] - s["reaped"], 1),
            "device_workers_cpu_s": round(device_workers_cpu_s, 1),
            "broker_cpu_s": round(now["broker"] - s["broker"], 1),
            "machine_busy_pct": round(
                100 * (now["busy"] - s["busy"]) / max(1.0, now["total"] - s["total"]), 1
            ),
            "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        }


# -- one case ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class InlineOptions:
    reaction_ms: int = REACTION_MS
    device_workers: int = DEVICE_WORKERS
    presynth: bool = True
    presynth_nice: int = 19


async def one_case(
    n: int, rounds: int, pattern: str, root: Path, options: InlineOptions
) -> dict[str, Any]:
    spread_s = ROUND_PERIOD_S if pattern == "staggered" else 0.0
    k = max(1, min(options.device_workers, n))
    async with local_broker(root / "data") as broker:
        ids = device_ids(n)
        backends = [f"inline-backend-{w}" for w in range(k)]
        accounts = await asyncio.to_thread(
            provision_all, broker, dict.fromkeys(ids, "device") | dict.fromkeys(backends, "backend")
        )
        await wait_accepted(broker, {b: accounts[b] for b in backends})  # written last
        catalog = write_catalog(root, rounds)
        settings = gateway_sections(
            broker,
            gateway_id="inline-gw",
            use=Use.LOAD,
            asr={"engine": "pocketsphinx", "workers": ASR_WORKERS},
            runtime={"catalog_path": str(catalog), "resource_dir": str(catalog / "resources")},
            store={"sqlite_path": str(root / "gateway.sqlite3")},
            speech={"presynth": options.presynth, "presynth_nice": options.presynth_nice},
        )
        clients = {dev: str(uuid.uuid4()) for dev in ids}
        save_bindings(
            bindings_path(Path(settings["data_dir"])), {d: Binding(c) for d, c in clients.items()}
        )
        offsets = [spread_s * i / n for i in range(n)]
        specs = [
            {
                "host": broker.host,
                "port": broker.port,
                "devices": {d: [accounts[d], clients[d]] for d in share},
                "seeds": seeds,
                "offsets_s": offs,
                "backend": [backends[w], accounts[backends[w]]],
                "rounds": rounds,
                "reaction_s": options.reaction_ms / 1000,
                "tail_ms": TAIL_MS,
            }
            for w, (share, seeds, offs) in enumerate(
                zip(split(ids, k), split(list(range(n)), k), split(offsets, k), strict=True)
            )
        ]
        deadline_s = spread_s + rounds * 3 * ROUND_WAIT_S + 60
        gw = GatewayProcess(root / "gw", settings, module="bench.inline_gateway")
        try:
            began = time.monotonic()
            await gw.start(timeout_s=WARM_UP_TIMEOUT_S + 60)
            warm_s = time.monotonic() - began
            async with workers("bench.inline_devices", specs, root) as procs:
                for proc in procs:
                    await proc.line(300)  # every device online
                meter = InlineCpuMeter(gw.pid, broker.local_pid)
                before = await asyncio.to_thread(gw.metrics)
                meter.begin()
                t0 = time.time() + START_LEAD_S
                for proc in procs:
                    proc.go(t0)
                found = [await proc.line(deadline_s) for proc in procs]
                cpu = meter.end(sum(f["cpu_s"] for f in found))
                after = await asyncio.to_thread(gw.metrics)
        finally:
            await gw.stop()
    results = [AnsweredRound(**r) for f in found for r in f["rounds"]]
    failures = [x for f in found for x in f["failures"]]
    figures = {k: v - before.get(k, 0.0) if k.endswith("_total") else v for k, v in after.items()}
    summary = summarize(n, rounds, results, failures, cpu=cpu, snapshot=figures)
    return {
        "pattern": pattern,
        **summary,
        "device_workers": len(procs),
        "gateway_warm_up_s": round(warm_s, 1),
        "phrases_prepared": after.get("snlpgw_speech_prepared_phrases", 0.0),
        "phrase_preparation_s": round(after.get("snlpgw_speech_prepare_seconds", 0.0), 1),
    }


def summarize(
    n: int,
    rounds: int,
    done: list[AnsweredRound],
    failed: list[str],
    *,
    cpu: dict[str, float],
    snapshot: dict[str, float],
) -> dict[str, Any]:
    """``snapshot``: the gateway's metrics over the case (counters as the case's increase)."""
    neutral = neutral_text()
    heard = [r for r in done if r.first_frame is not None and r.close_ms is not None]
    from_close = [r.first_frame * 1000 - r.close_ms for r in heard]  # type: ignore[operator]
    from_last = [(r.first_frame - r.last_packet) * 1000 for r in heard]  # type: ignore[operator]
    neutral_rounds = [r for r in done if r.feedback == neutral]
    transcribed = [
        r.signals_ms - r.close_ms
        for r in done
        if r.signals_ms is not None and r.close_ms is not None
    ]
    # Offered load: answers ended per second while the devices were answering.
    span_s = max((r.last_packet for r in done), default=0.0) - min(
        (r.answer_start for r in done), default=0.0
    )
    answers_s = len(done) / span_s if span_s > 0 else 0.0
    asr_cpu = cpu["asr_workers_cpu_s"]
    return {
        "n": n,
        "rounds_per_device": rounds,
        "rounds_answered": len(done),
        "rounds_with_feedback_frame": len(heard),
        "devices_failed": len(failed),
        "failures": failed[:5],
        "listen_end_to_first_feedback_ms": stats(from_close),
        "last_answer_packet_to_first_feedback_ms": stats(from_last),
        # listen end -> the step's numbers published (transcript back, or the neutral path)
        "listen_end_to_step_signals_ms": stats(transcribed),
        # the device workers' own health: how much longer than real time an answer took to
        # send (a worker short of CPU stretches answers, and the listen end with them)
        "answer_send_overrun_ms": stats(
            [(r.last_packet - r.answer_start) * 1000 - r.answer_ms for r in done]
        ),
        "within_budget_pct": round(
            100 * sum(1 for v in from_close if v <= BUDGET_MS) / max(1, len(from_close)), 1
        ),
        "neutral_line_rounds": len(neutral_rounds),
        "feedback_heard": {
            "right": sum(1 for r in done if r.feedback == "Right!"),
            "wrong": sum(1 for r in done if (r.feedback or "").startswith("It is ")),
            "neutral": len(neutral_rounds),
            "none": sum(1 for r in done if r.feedback is None),
        },
        "neutral_line_latency_ms": stats(
            [r.first_frame * 1000 - r.close_ms for r in neutral_rounds if r in heard]  # type: ignore[operator]
        ),
        "answers_per_s_offered": round(answers_s, 2),
        # per transcribed job (dropped jobs cost nothing; the warm-up jobs ran before)
        "asr_cpu_s_per_answer": round(
            asr_cpu / max(1.0, snapshot.get("snlpgw_asr_jobs_done_total", 0.0)), 3
        ),
        "speech_metrics": {
            k.removeprefix("snlpgw_"): v
            for k, v in snapshot.items()
            if k.startswith(("snlpgw_speak", "snlpgw_speech")) and "_bucket" not in k
        },
        "asr_metrics": {
            k.removeprefix("snlpgw_"): v
            for k, v in snapshot.items()
            if "asr_jobs" in k or "asr_latency_ms" in k
        },
        "cpu": cpu,
    }


def stats(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {"count": 0}
    return {
        "count": len(samples),
        "p50": round(quantile(samples, 0.50)),
        "p95": round(quantile(samples, 0.95)),
        "p99": round(quantile(samples, 0.99)),
        "max": round(max(samples)),
    }


# -- report --------------------------------------------------------------------------------------
def markdown(doc: dict[str, Any]) -> str:
    rows = [
        "# Inline assessment budget: listen end → first feedback audio at the device\n",
        "Issue #27 item 3 (budget p99 ≤ 1.5 s, embedded engines). "
        f"`{doc['command']}`. Per case a fresh Mosquitto; the gateway in a process of its own "
        f"(pocketsphinx pool of {ASR_WORKERS} worker processes, espeak-ng SPEAK), warmed up "
        "before the devices start (one transcription per ASR worker; "
        + (
            "the catalog's fixed phrases prepared in SPEAK's phrase cache: `speech.presynth`"
            if doc["presynth"]
            else "**no** phrase preparation: `--no-presynth`"
        )
        + f"); N devices (board simulator + Xiaozhi simulator over encrypted UDP) in "
        f"{doc['device_workers']} worker processes of their own (fewer when N is smaller), each "
        "running `arithmetic_10` "
        f"and answering every question {doc['reaction_ms']} ms after it was said (a child's "
        "reaction time) in real time with pre-synthesized espeak-ng speech "
        f'("it is seven" + {TAIL_MS} ms silence). Figures are the gateway\'s listen end '
        "(`window.closed.actual_close_ms`: VAD segment end) → the first Opus frame of the "
        "feedback decrypted at the device, one wall clock (`time.time()`, every process on one "
        f"machine). Machine: {doc['machine']}.\n",
        "| N | starts | rounds | p50 | p95 | p99 | max | ≤ 1.5 s | neutral line | answers/s offered "
        "| ASR CPU s/answer | from last answer packet p50 / p99 | CPU: gateway / ASR workers / "
        "SPEAK subprocesses / device workers / broker (s) | machine busy | wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in doc["cases"]:
        f, g, cpu = (
            c["listen_end_to_first_feedback_ms"],
            c["last_answer_packet_to_first_feedback_ms"],
            c["cpu"],
        )
        rows.append(
            f"| {c['n']} | {c['pattern']} | {c['rounds_with_feedback_frame']}/{c['n'] * c['rounds_per_device']} "
            f"| {f.get('p50')} ms | {f.get('p95')} ms | **{f.get('p99')} ms** | {f.get('max')} ms "
            f"| {c['within_budget_pct']} % | {c['neutral_line_rounds']} "
            f"| {c['answers_per_s_offered']} | {c['asr_cpu_s_per_answer']} "
            f"| {g.get('p50')} / {g.get('p99')} ms "
            f"| {cpu['gateway_cpu_s']} / {cpu['asr_workers_cpu_s']} / "
            f"{cpu['speak_subprocesses_cpu_s']} / {cpu['device_workers_cpu_s']} / "
            f"{cpu['broker_cpu_s']} | {cpu['machine_busy_pct']} % | {cpu['wall_s']} s |"
        )
    rows += [
        "",
        "Per case: device worker processes; answer send overrun p50 / p99 (an answer's "
        "send time beyond its real-time duration: device workers short of CPU stretch the "
        "answers, and the listen end with them; large values make the case a measure of the "
        "simulators too); phrases prepared before the devices started and "
        "how long that took (at the lowest CPU priority, while nothing else of the case ran); "
        "SPEAK's phrase cache hits / misses during the case (a miss is a synthesis on the "
        "lesson's path); the gateway's start to ready (warm-up included).\n",
        "| N | starts | device workers | answer send overrun p50 / p99 | phrases prepared "
        "| preparation | cache hits / misses | gateway start to ready |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in doc["cases"]:
        m, o = c["speech_metrics"], c["answer_send_overrun_ms"]
        rows.append(
            f"| {c['n']} | {c['pattern']} | {c['device_workers']} "
            f"| {o.get('p50')} / {o.get('p99')} ms | {c['phrases_prepared']:.0f} "
            f"| {c['phrase_preparation_s']} s | {m.get('speech_cache_hits_total', 0):.0f} / "
            f"{m.get('speech_cache_misses_total', 0):.0f} | {c['gateway_warm_up_s']} s |"
        )
    rows.append("")
    rows += capacity_notes(doc)
    return "\n".join(rows) + "\n"


def capacity_notes(doc: dict[str, Any]) -> list[str]:
    """The arithmetic: answers offered per second against what the ASR pool can transcribe."""
    workers = doc["asr_workers"]
    lines = [
        "## Capacity arithmetic\n",
        "ASR CPU per answer = ASR worker CPU / jobs transcribed (pocketsphinx, ~1.2 s answers with the "
        "number words as hints). Capacity = answers/s the pool could transcribe if its "
        f"{workers} workers had a core each to themselves ({workers} / CPU per answer); "
        "obtained = ASR worker CPU / wall time (cores the workers actually got on this shared "
        "machine). Offered = answers ended per second while the devices answered. Transcript "
        "back = the listen end → the gateway's `step.signals` event for the step (published "
        "when the transcript arrived, or when the neutral path gave up on it).\n",
        "| N | starts | offered answers/s | ASR CPU s/answer | capacity answers/s "
        "| ASR cores needed | ASR cores obtained | listen end → transcript back p50 / p99 | p99 ≤ 1.5 s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in doc["cases"]:
        per = c["asr_cpu_s_per_answer"]
        cap = workers / per if per > 0 else float("inf")
        cpu = c["cpu"]
        obtained = cpu["asr_workers_cpu_s"] / cpu["wall_s"] if cpu["wall_s"] else 0.0
        t = c["listen_end_to_step_signals_ms"]
        p99 = c["listen_end_to_first_feedback_ms"].get("p99", float("inf"))
        lines.append(
            f"| {c['n']} | {c['pattern']} | {c['answers_per_s_offered']} | {per} | {cap:.1f} "
            f"| {c['answers_per_s_offered'] * per:.2f} | {obtained:.2f} "
            f"| {t.get('p50')} / {t.get('p99')} ms "
            f"| {'yes' if p99 <= doc['budget_ms'] else 'no'} |"
        )
    lines += [
        "",
        "The neutral line is spoken when the transcript is not back within "
        f"{doc['asr_timeout_ms']:.0f} ms of the listen end or the job was dropped (the ASR "
        "queue keeps 32 jobs, dropping the oldest): a round that got it took at least that long "
        "or was shed. Feedback heard per case (right / wrong / neutral / none) is in the JSON "
        "(`feedback_heard`). SPEAK subprocesses = the espeak-ng and sox runs of the gateway "
        "that ended during the case (the CPU of its reaped children). The reading of the committed run, and what 200 concurrent "
        "tasks need: docs/tasks.md, *Inline latency budget (measured)*.",
        "",
    ]
    return lines


async def main_async(
    cases: list[tuple[int, int, str]], options: InlineOptions, command: str
) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    for n, rounds, pattern in cases:
        with tempfile.TemporaryDirectory(prefix="snlpgw-inline-") as tmp:
            out.append(await one_case(n, rounds, pattern, Path(tmp), options))
        sys.stderr.write(json.dumps(out[-1]) + "\n")
    return {
        "bench": "inline_budget",
        "command": command,
        "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, "
        f"python {platform.python_version()}",
        "budget_ms": BUDGET_MS,
        "asr_workers": ASR_WORKERS,
        "asr_timeout_ms": ASR_TIMEOUT_MS,
        "tail_ms": TAIL_MS,
        "reaction_ms": options.reaction_ms,
        "device_workers": options.device_workers,
        "presynth": options.presynth,
        "cases": out,
    }


def parse_cases(text: str) -> list[tuple[int, int, str]]:
    """``N:rounds[:staggered|burst]``, comma-separated."""
    out = []
    for part in text.split(","):
        n, rounds, *rest = part.split(":")
        pattern = rest[0] if rest else "staggered"
        if pattern not in ("staggered", "burst"):
            raise argparse.ArgumentTypeError(f"unknown start pattern {pattern!r}")
        out.append((int(n), int(rounds), pattern))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--cases", type=parse_cases, default=list(CASES), help="N:rounds[:pattern],..."
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument(
        "--reaction-ms",
        type=int,
        default=REACTION_MS,
        help="each answer starts this long after its question was said",
    )
    parser.add_argument(
        "--device-workers", type=int, default=DEVICE_WORKERS, help="device worker processes"
    )
    parser.add_argument(
        "--no-presynth",
        action="store_true",
        help="no phrase preparation (speech.presynth off): phrases synthesized on first use",
    )
    parser.add_argument(
        "--presynth-nice",
        type=int,
        default=19,
        help="niceness of the phrase preparation (speech.presynth_nice; the test uses 0: the "
        "gateway reports ready after it, and a busy machine leaves nice 19 nothing)",
    )
    args = parser.parse_args(argv)
    options = InlineOptions(
        args.reaction_ms, max(1, args.device_workers), not args.no_presynth, args.presynth_nice
    )
    command = " ".join(["python -m bench.inline_budget", *(sys.argv[1:] if argv is None else argv)])
    doc = asyncio.run(main_async(args.cases, options, command))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "inline_budget.json").write_text(json.dumps(doc, indent=2) + "\n", "utf-8")
    (args.out / "inline_budget.md").write_text(markdown(doc), "utf-8")
    sys.stdout.write(markdown(doc))
    return doc


if __name__ == "__main__":
    main()
