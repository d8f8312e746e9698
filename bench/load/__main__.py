"""Load harness: ``python -m bench.load`` (``make load``). See bench/load/README section in the
project README and the module docs of :mod:`bench.load.lessons`, :mod:`bench.load.hellos`,
:mod:`bench.load.stream`.

Phases (each with its own broker and gateway process, each bounded in time):

* ``stream``: the floor (libraries alone) and the gateway's real UDP path at K sessions;
* ``lessons``: N concurrent lessons, staggered and simultaneous starts;
* ``hellos``: hello → reply at N Xiaozhi sessions.

Writes ``load.json``, ``load.md``, ``latency_cdf.png`` and ``cpu_vs_n.png`` into ``--out``
(default bench/results/load/). ``--quick``: tiny sizes, for the smoke test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from bench.load import hellos, lessons, stream
from bench.load.floor import floor
from bench.load.plots import cpu_vs_n, latency_cdf
from bench.load.procs import load_conditions
from bench.load.report import markdown

RESULTS = Path(__file__).resolve().parent.parent / "results" / "load"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.load")
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    p.add_argument("--phases", default="stream,lessons,hellos")
    p.add_argument("--lessons", type=ints, default=[200, 500, 1000])
    p.add_argument("--starts", default="staggered,simultaneous")
    p.add_argument("--clips", type=int, default=5)
    p.add_argument("--clip-ms", type=int, default=1500)
    p.add_argument("--sessions", type=int, default=1000, help="Xiaozhi devices saying hello")
    p.add_argument("--hellos-per-device", type=int, default=3)
    p.add_argument("--hello-span-s", type=float, default=15.0)
    p.add_argument("--stream", type=ints, default=[100, 200, 400, 600, 800])
    p.add_argument("--stream-measure-s", type=float, default=8.0)
    p.add_argument("--workers", type=int, default=2, help="board/device worker processes")
    p.add_argument("--profile", type=Path, help="py-spy collapsed stacks of the gateway here")
    p.add_argument(
        "--shared-cores",
        action="store_true",
        help="lessons and hellos: leave the gateway on every CPU beside the broker and workers "
        "(default: a CPU of its own)",
    )
    p.add_argument(
        "--gateway-settings",
        type=json.loads,
        default={},
        help="settings sections over the harness's for the lessons' and hellos' gateway (A/B), "
        'e.g. \'{"mqtt": {"max_inflight": 20}}\'',
    )
    p.add_argument(
        "--broker-config",
        default="",
        help="lines appended to the lessons' broker config (A/B; a repeated numeric option's "
        "last line wins, Mosquitto refuses a repeated string option), e.g. "
        "'max_inflight_messages 100'; \\n separates lines",
    )
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.lessons, args.clips, args.clip_ms = [5], 2, 300
        args.sessions, args.hellos_per_device, args.hello_span_s = 5, 2, 1.0
        args.stream, args.stream_measure_s, args.workers = [5], 2.0, 1
    return args


def host_speed() -> dict[str, Any]:
    """The CPU model and a fixed pure-Python workload's best time (ms), so runs on different
    hosts can be told apart: the gateway's CPU per step follows the host's speed."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break

    def work() -> float:
        t0 = time.perf_counter()
        table: dict[str, list[int]] = {}
        for i in range(200_000):
            table.setdefault(f"k{i % 997}", []).append(i)
        return (time.perf_counter() - t0) * 1000

    return {"cpu_model": model, "python_workload_ms": round(min(work() for _ in range(5)), 1)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    phases = args.phases.split(",")
    place = not args.shared_cores
    broker_config = args.broker_config.replace("\\n", "\n")
    doc: dict[str, Any] = {
        "bench": "load",
        "machine": f"{platform.machine()} {platform.system()} python {platform.python_version()}",
        "host": host_speed(),
        # What an A/B changed, so every row can be checked against its configuration.
        "gateway_settings": args.gateway_settings,
        "broker_config": broker_config,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_before": load_conditions(),
        "quick": args.quick,
        "failed": [],  # runs that did not finish (timeouts on a starved machine), said so
    }
    if "stream" in phases:
        runs, floors = [], []
        passes = {"passes": 5, "warmup": 1} if args.quick else {}
        for k in args.stream:  # the floor alone before every run and after the last
            floors.append(floor(**passes))
            with tempfile.TemporaryDirectory(prefix="snlpgw-load-") as tmp:
                prof = None if args.profile is None else args.profile / f"stream-{k}.txt"
                run = await bounded(stream.gateway_run(k, Path(tmp), args.stream_measure_s,
                                                       profile=prof), sessions=k)  # fmt: skip
            log(run)
            if "error" not in run:
                runs.append(run)
        floors.append(floor(**passes))
        doc["stream"] = stream.summarize(floors, runs)
    if "lessons" in phases:
        doc["lessons"] = []
        for n in args.lessons:
            for start in args.starts.split(","):
                with tempfile.TemporaryDirectory(prefix="snlpgw-load-") as tmp:
                    prof = (
                        None if args.profile is None else args.profile / f"lessons-{n}-{start}.txt"
                    )
                    result = await bounded(lessons.run(n, start, Path(tmp), clips=args.clips,
                                               clip_ms=args.clip_ms, worker_count=args.workers,
                                               profile=prof, settings=args.gateway_settings,
                                               place=place, broker_config=broker_config),
                                           lessons=n, start=start)  # fmt: skip
                log(result)
                (doc["lessons"] if "error" not in result else doc["failed"]).append(result)
    if "hellos" in phases:
        with tempfile.TemporaryDirectory(prefix="snlpgw-load-") as tmp:
            result = await bounded(hellos.run(
                args.sessions, Path(tmp), per_device=args.hellos_per_device,
                span_s=args.hello_span_s, worker_count=args.workers,
                settings=args.gateway_settings, place=place,
            ), sessions=args.sessions)  # fmt: skip
            if "error" in result:
                doc["failed"].append(result)
            else:
                doc["hellos"] = result
    doc["load_after"] = load_conditions()
    return doc


async def bounded(run: Coroutine[Any, Any, dict[str, Any]], **what: Any) -> dict[str, Any]:
    """A run's result, or what failed (a run that times out must not sink the others)."""
    try:
        return await run
    except (TimeoutError, RuntimeError, OSError) as exc:
        return {**what, "error": f"{type(exc).__name__}: {exc}"}


def log(result: dict[str, Any]) -> None:
    brief = {k: v for k, v in result.items() if k != "samples_ms"}
    sys.stderr.write(json.dumps(brief) + "\n")


def write(doc: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    runs = doc.get("lessons", [])
    hello = doc.get("hellos")
    latency_cdf(runs, hello, out / "latency_cdf.png")
    cpu_vs_n(runs, doc.get("stream"), out / "cpu_vs_n.png")
    (out / "load.md").write_text(markdown(doc))
    slim = json.loads(json.dumps(doc))  # raw samples stay out of the committed JSON
    for run in slim.get("lessons", []):
        run.pop("samples_ms", None)
    for phase in ("staggered", "burst"):
        if slim.get("hellos"):
            slim["hellos"][phase].pop("samples_ms", None)
    (out / "load.json").write_text(json.dumps(slim, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    doc = asyncio.run(run(args))
    write(doc, args.out)
    sys.stdout.write((args.out / "load.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
