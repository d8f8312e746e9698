"""Lesson phase: N concurrent shadowing lessons, boards in worker processes, gateway alone (or
G gateway processes sharing the boards in cluster mode, :func:`sharded`).

Per N and start pattern, a fresh broker and gateway: the boards connect, then every lesson
starts at once (``simultaneous``: every window closes in the same few milliseconds, the worst
case) or spread evenly over one step period (``staggered``, the usual case). Measured from the
boards: audio.completed → next PLAY_MEDIA error (see :mod:`bench.load.boards`); from /proc:
gateway, broker and board-worker CPU over the lessons, gateway RSS before and at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.load.probe import PROBE_USER, probing, stalls
from bench.load.procs import (
    CpuSample,
    Meter,
    cpu_s,
    descendants,
    harness_on,
    place_gateways,
    rss_bytes,
    sample_cpus,
)
from bench.load.stack import split, workers
from bench.load.stream import start_profiler
from bench.stats import summary
from devstack.broker import Broker, local_broker, wait_connectable
from devstack.gateway import Use, gateway_sections
from devstack.process import GatewayProcess, gateway_process
from gateway.broker.credentials import provision
from gateway.settings import merge_sections
from gateway.tasks.core.rules import listen_window_ms
from tests.support.postgres import start_postgres

APP, TASK, LESSON = "load", "shadowing", "l1"
After = Callable[[GatewayProcess], Awaitable[dict[str, Any]]]
RATIO, MIN_WINDOW_MS = 1.2, 800  # SPEC defaults
START_LEAD_S = 1.0
NOT_OWNER = "snlpgw_board_inbound_dropped_total{"  # with reason=not_owner: another's board


def device_ids(n: int) -> list[str]:
    return [f"b1_00_00_00_{i >> 8:02x}_{i & 0xFF:02x}" for i in range(n)]


def write_catalog(path: Path, clips: int, sentences: list[str] | None = None) -> list[str]:
    """The harness's lesson; with ``sentences`` (the clips' texts, in turn) assessment is on."""
    names = [f"c{i + 1:02d}.mp3" for i in range(clips)]
    texts = [sentences[i % len(sentences)] for i in range(clips)] if sentences else None
    assessment = (
        {"enabled": True, "methods": ["text_similarity_v0"], "defer": True}
        if texts
        else {"enabled": False, "methods": [], "defer": True}
    )
    task = {
        "app_id": APP, "task_id": TASK, "interaction_mode": "SHADOWING",
        "listen_ratio": RATIO, "min_window_ms": MIN_WINDOW_MS, "assessment": assessment,
        "lessons": [{"lesson_id": LESSON, "clips": names,
                     "sentences": texts or [f"s{c}" for c in names]}],
    }  # fmt: skip
    path.write_text(json.dumps([task]))
    return [f"/{APP}/{TASK}/lessons/{LESSON}/{name}" for name in names]


def provision_all(broker: Broker, roles: dict[str, str]) -> dict[str, str]:
    """Broker accounts for every name (name → role) with one reload at the end (not one per
    device; two reloads back to back can lose the second: Mosquitto drops a SIGHUP that lands
    during a reload, which once left a board worker's backend refused)."""
    out = {}
    for name, role in roles.items():
        password = provision(broker.data_dir, name, role=role, reload=None).password  # type: ignore[arg-type]
        assert password is not None
        out[name] = password
    broker.reload()
    return out


async def wait_accepted(broker: Broker, users: dict[str, str]) -> None:
    """Until the broker accepts each of ``users`` (name → password), signalling the reload
    again while refused (:func:`devstack.broker.wait_connectable`)."""
    for name, password in users.items():
        await wait_connectable(broker, name, password)


async def sample_rss(pid: int, out: list[int], period_s: float = 0.5) -> None:
    while True:
        await asyncio.sleep(period_s)
        out.append(rss_bytes(pid))


@contextlib.asynccontextmanager
async def sampling(
    pid: int, rss: int
) -> AsyncIterator[tuple[list[int], list[CpuSample], list[str]]]:
    """While the block runs: ``pid``'s RSS every 0.5 s (after ``rss``), and its CPU and every
    CPU's busy share every 0.1 s; a sampler that failed is named in the third list (filled
    when the block ends), its figures cut short."""
    peak: list[int] = [rss]
    busy: list[CpuSample] = []
    failed: list[str] = []
    tasks = [
        asyncio.create_task(sample_rss(pid, peak), name="load.rss"),
        asyncio.create_task(sample_cpus(pid, busy), name="load.cpus"),
    ]
    try:
        yield peak, busy, failed
    finally:
        for task in tasks:
            task.cancel()
        for task, result in zip(
            tasks, await asyncio.gather(*tasks, return_exceptions=True), strict=True
        ):
            if isinstance(result, Exception):
                failed.append(f"{task.get_name()}: {result!r}")


async def run(n: int, pattern: str, root: Path, *, clips: int, clip_ms: int,
              worker_count: int, profile: Path | None = None,
              settings: dict[str, Any] | None = None, place: bool = True,
              broker_config: str = "", speech: dict[str, Any] | None = None,
              asr_pids: list[int] | None = None,
              after: After | None = None, gateways: int = 1) -> dict[str, Any]:  # fmt: skip
    """One lessons case. ``speech`` (``sentences``, ``lead_ms``, ``tail_ms``, ``quiet_s``,
    ``drain_s``): the boards answer every window with real speech over their Xiaozhi voice
    sessions (:mod:`bench.load.speaking`) and assessment is on (the ASR engine is the
    settings'); ``asr_pids``: the ASR service's processes, metered (CPU) and placed with the
    broker and the workers, off the gateway's CPU; ``after``: run with the gateway once the
    lessons and their measurements are over (its figures under ``"after"``)."""
    step_s = (clip_ms + listen_window_ms(clip_ms, RATIO, MIN_WINDOW_MS)) / 1000
    spread_s = step_s if pattern == "staggered" else 0.0
    deadline_s = spread_s + clips * step_s + 30.0
    async with local_broker(root / "data", extra_config=broker_config) as broker:
        paths = write_catalog(root / "catalog.json", clips, speech["sentences"] if speech else None)
        backend_names = [f"load-backend-{w}" for w in range(worker_count)]
        names = (
            dict.fromkeys(device_ids(n), "device")
            | {PROBE_USER: "gateway"}
            | dict.fromkeys(backend_names, "backend")  # last: see wait_accepted below
        )
        accounts = await asyncio.to_thread(provision_all, broker, names)
        devs = {d: accounts[d] for d in device_ids(n)}
        backends = {b: accounts[b] for b in backend_names}
        # Every worker's backend; the last is written last: accepted means every name was read.
        await wait_accepted(broker, backends)
        catalog = {"runtime": {"catalog_path": str(root / "catalog.json")}}
        # --gateway-settings merged field by field: a "runtime" section of its own keeps ours
        settings = gateway_sections(
            broker, gateway_id="load-gw", use=Use.LOAD, **merge_sections(catalog, settings or {})
        )
        offsets = [spread_s * i / n for i in range(n)]
        lesson = {"app": APP, "task": TASK, "lesson": LESSON, "paths": paths,
                  "clip_ms": clip_ms, "ratio": RATIO, "min_window_ms": MIN_WINDOW_MS}  # fmt: skip
        specs = []
        for w, (share, offs) in enumerate(
            zip(split(list(devs.items()), worker_count), split(offsets, worker_count), strict=True)
        ):
            specs.append({"worker": w, "host": broker.host, "port": broker.port,
                          "devices": dict(share), "offsets_s": offs, "lesson": lesson,
                          "backend": [f"load-backend-{w}", backends[f"load-backend-{w}"]],
                          "deadline_s": deadline_s, **speaking(speech, broker)})  # fmt: skip
        async with (
            sharded(root, settings, gateways) as (gws, store),
            workers("bench.load.boards", specs, root) as procs,
        ):
            for proc in procs:
                await proc.line(180)
            spy = await start_profiler(
                gws[0].pid, START_LEAD_S + spread_s + clips * step_s, profile
            )
            others = [broker.local_pid, *(p.pid for p in procs), *(asr_pids or []), *store]
            placement = place_gateways(
                [one.pid for one in gws], others + ([spy.pid] if spy else []), on=place
            )
            if speech:  # the voice sessions' hellos and what follows them, done before go
                await asyncio.gather(*(settled(one.pid) for one in gws))
            rss_idle = rss_bytes(gws[0].pid)
            meter = Meter(
                {"gateway": gws[0].pid, "broker": broker.local_pid}
                | {f"gateway{i}": one.pid for i, one in enumerate(gws) if i}
                | {f"store{i}": pid for i, pid in enumerate(store)}
                | {f"asr{i}": pid for i, pid in enumerate(asr_pids or [])}
            )
            t0 = time.time() + START_LEAD_S
            meter.start()
            for proc in procs:
                proc.go(t0)
            with harness_on(placement):
                async with (
                    sampling(gws[0].pid, rss_idle) as (peak, busy, sampler_errors),
                    probing(broker.host, broker.port, accounts[PROBE_USER]) as probe,
                ):
                    found = [await proc.line(deadline_s + 60) for proc in procs]
            cpu = totals(meter.stop({f"boards{i}": f["cpu_s"] for i, f in enumerate(found)}))
            each = await asyncio.gather(*(asyncio.to_thread(one.metrics) for one in gws))
            figures = merged_metrics(each)
            lateness, gc_full, gc_all = (
                quantile_stats(figures, "window_lateness_ms"),
                quantile_stats(figures, "gc_full_pause_ms"),
                quantile_stats(figures, "gc_pause_ms"),
            )
            if spy is not None:
                await spy.wait()
            then = await after(gws[0]) if after is not None else None
    to_play = [x for f in found for x in f["completed_to_play_error_ms"]]
    to_stop = [x for f in found for x in f["completed_to_stop_error_ms"]]
    by_clip = _by_clip(found)
    lags_at = [
        (at, lag)
        for f in found
        for at, lag in zip(f["loop_lag_at_ms"], f["loop_lag_ms"], strict=True)
    ]
    lags = [lag for _, lag in lags_at]
    due_ms = [x for f in found for x in f["completed_to_play_due_ms"]]
    first_due = min(due_ms, default=0.0)  # the origin of every "second" below
    by_second = _by_second(due_ms, to_play)
    rtts = probe.samples
    board_cpu = sum(v for k, v in cpu.items() if k.startswith("boards") and k.endswith("_cpu_s"))
    return {
        **(speech_figures(found, figures, cpu) if speech else {}),
        **({"after": then} if then is not None else {}),
        "lessons": n,
        "start": pattern,
        "clips": clips,
        "clip_ms": clip_ms,
        "window_ms": listen_window_ms(clip_ms, RATIO, MIN_WINDOW_MS),
        "lessons_completed": sum(f["lessons_completed"] for f in found),
        "refused_starts": sum(len(f["refused"]) for f in found),
        "unfinished_sample": {k: v for f in found for k, v in f["unfinished"].items()},
        "timeline_first_board": found[0].get("timeline_first_board"),
        "steps_measured": len(to_play),
        "steps_expected": n * (clips - 1),
        "completed_to_next_play_error_ms": summary(to_play),
        # The same error cut at the gateway's own stamp in each PLAY_MEDIA ("ts": its wall
        # clock when it built the command; bench.load.boards.stamped): the gateway's part (the
        # board's completed on its way in, the gateway's queue and window timer) and the rest
        # (the gateway's publish, the broker, the board worker's loop noting the receipt: a
        # lagging worker shows here, not in the first).
        "next_play_error_gateway_part_ms": summary(
            [x for f in found for x in f.get("completed_to_play_stamped_ms", [])]
        ),
        "next_play_error_delivery_part_ms": summary(
            [x for f in found for x in f.get("play_stamped_to_received_ms", [])]
        ),
        # Per PLAY_MEDIA received: its board worker's loop lag in the 50 ms around the receipt
        # (bench.load.boards.worker_lag_at): the board side's share of the delivery part.
        "next_play_worker_lag_ms": summary(
            [x for f in found for x in f.get("play_worker_lag_ms", [])]
        ),
        # After which clip: clip 1's window closes while later lessons are still starting.
        "completed_to_next_play_error_by_clip_ms": {
            str(clip): summary(errors) for clip, errors in sorted(by_clip.items())
        },
        "last_window_to_listen_stop_error_ms": summary(to_stop),
        # Start request published → the lesson's first PLAY_MEDIA received: what admission
        # pacing (``runtime.start_rate_per_s``) costs a herd of starts, both hops included.
        "start_to_first_play_ms": summary([x for f in found for x in f["start_to_first_play_ms"]]),
        # completed published → LISTEN_START received: how long the gateway took to answer
        # the completed (inbound hop, its queue, its outbound path and hop). The window's
        # deadline is set when it handles the completed: only the first two are in the error.
        "completed_to_listen_start_ms": summary(
            [x for f in found for x in f["completed_to_listen_ms"]]
        ),
        "listen_start_missing": sum(f["listen_start_missing"] for f in found),
        "board_worker_loop_lag_ms": summary(lags),
        "broker_round_trip_ms": summary([rtt for _, rtt in rtts]),
        "broker_stalls": stalls(rtts, first_due / 1000),
        "broker_probe_error": probe.error,
        "sampler_errors": sampler_errors,
        "gateway_window_lateness_ms": lateness,
        "gateway_gc_full_pause_ms": gc_full,  # the last 2,048 full collections' pauses
        "gateway_gc_pause_ms": gc_all,  # every generation's, the last 2,048
        "gateway_rss_idle_mb": round(rss_idle / 2**20, 1),
        "gateway_rss_peak_mb": round(max(peak) / 2**20, 1),
        "gateway_rss_per_lesson_kb": round((max(peak) - rss_idle) / 1024 / n, 1),
        "gateway_rss_mb_every_30s": [round(b / 2**20, 1) for b in peak[::60]],  # 0.5 s samples
        # Per clip step the boards saw through (its completed answered by the next command).
        "gateway_cpu_ms_per_step": round(
            cpu["gateways_cpu_s"] * 1000 / max(1, len(to_play) + len(to_stop)), 2
        ),
        "placement": placement,
        "gateways": gateways,
        "per_gateway": per_gateway(gws, each, cpu),
        "board_workers": len(found),
        "board_loop": sorted({f.get("loop", "asyncio") for f in found}),
        "board_workers_cpu_s": round(board_cpu, 2),
        **{k: v for k, v in cpu.items() if not k.startswith("boards")},
        "samples_ms": to_play,
        # By the second (from the first window) its window was due: where the tail sits in time.
        "completed_to_next_play_error_by_second_ms": by_second,
        "worst_seconds": _worst_seconds(
            by_second,
            first_due,
            {
                "board_worker_lag_max_ms": lags_at,
                "broker_round_trip_max_ms": [(at * 1000, rtt) for at, rtt in rtts],
                "gateway_process_cpu_max": [(c.at_ms, c.process) for c in busy],
                "others_cpus_busy_max": _busy_of(busy, placement["others_cpus"]),
                "steal_max": [(c.at_ms, c.steal) for c in busy],
            },
        ),
    }


@contextlib.asynccontextmanager
async def sharded(
    root: Path, settings: dict[str, Any], count: int
) -> AsyncIterator[tuple[list[GatewayProcess], list[int]]]:
    """``count`` gateway processes serving the devices between them, and their store's server
    processes (none for SQLite). One: the gateway of ``settings`` alone (its SQLite store). More: a
    cluster (docs/scale-out.md) of ``load-gw0..`` on one throw-away PostgreSQL, each with its
    own data dir, every one settled (seeing all the others, owning its share) before the
    boards connect."""
    if count == 1:
        async with gateway_process(root, settings) as gw:
            yield [gw], []
        return
    pg = await asyncio.to_thread(start_postgres)
    try:
        url = await asyncio.to_thread(pg.new_database)
        async with contextlib.AsyncExitStack() as stack:
            gws = []
            for i in range(count):
                one = merge_sections(settings, {
                    "gateway_id": f"load-gw{i}", "data_dir": str(root / f"gw{i}" / "data"),
                    "store": {"url": url}, "cluster": {"enabled": True},
                })  # fmt: skip
                gws.append(await stack.enter_async_context(gateway_process(root / f"gw{i}", one)))
            for gw in gws:
                await _cluster_settled(gw, count)
            yield gws, [pg.proc.pid, *descendants(pg.proc.pid)]  # the server and its backends
    finally:
        await asyncio.to_thread(pg.stop)


async def _cluster_settled(gw: GatewayProcess, members: int, limit_s: float = 60.0) -> None:
    for _ in range(int(limit_s * 10)):
        figures = await asyncio.to_thread(gw.metrics)
        if (
            figures.get("snlpgw_cluster_members") == members
            and figures.get("snlpgw_cluster_settled") == 1
        ):
            return
        await asyncio.sleep(0.1)  # the membership is the broker's retained statuses: polled
    raise RuntimeError(f"{gw.gateway_id} did not see {members} gateways in {limit_s} s")


def totals(cpu: dict[str, float]) -> dict[str, float]:
    """``cpu`` (:meth:`Meter.stop`) with the store's processes as one ``store_cpu_s`` and every
    gateway process's CPU summed in ``gateways_cpu_s``."""
    out = {k: v for k, v in cpu.items() if not k.startswith("store")}
    out["store_cpu_s"] = round(
        sum(v for k, v in cpu.items() if k.startswith("store") and k.endswith("_cpu_s")), 3
    )
    out["gateways_cpu_s"] = round(
        sum(v for k, v in cpu.items() if k.startswith("gateway") and k.endswith("_cpu_s")), 3
    )
    return out


def per_gateway(
    gws: list[GatewayProcess], each: list[dict[str, float]], cpu: dict[str, float]
) -> list[dict[str, Any]]:
    """What each gateway process did: its CPU, its share of the lessons, and the other
    gateways' board traffic it received and left to them (every gateway reads every uplink)."""
    return [
        {
            "gateway_id": gw.gateway_id,
            "cpu_s": cpu[f"gateway{i or ''}_cpu_s"],
            "lessons_completed": int(
                mine.get("snlpgw_runtime_task_events_total{event=instance.completed}", 0.0)
            ),
            "left_to_owner": int(
                sum(v for k, v in mine.items() if k.startswith(NOT_OWNER) and "not_owner" in k)
            ),
        }
        for i, (gw, mine) in enumerate(zip(gws, each, strict=True))
    ]


def merged_metrics(each: list[dict[str, float]]) -> dict[str, float]:
    """The gateways' samples as one: counters (and quantile gauges' ``count``) summed, the
    other quantile gauges (``stat=p99`` ...) the largest: the worst gateway's."""
    out: dict[str, float] = {}
    for figures in each:
        for name, value in figures.items():
            if name not in out:
                out[name] = value
            elif "stat=" in name and "stat=count" not in name:
                out[name] = max(out[name], value)
            else:
                out[name] += value
    return out


def _by_clip(found: list[dict[str, Any]]) -> dict[int, list[float]]:
    """The next-clip errors by the clip whose completion they follow (1 = the first)."""
    by_clip: dict[int, list[float]] = {}
    for f in found:
        for clip, error in zip(
            f["completed_to_play_clip"], f["completed_to_play_error_ms"], strict=True
        ):
            by_clip.setdefault(clip + 1, []).append(error)
    return by_clip


def _busy_of(samples: list[CpuSample], cpus: list[int] | str) -> list[tuple[float, float]]:
    """(at, mean busy share of ``cpus``) per sample; every CPU when the run was not placed."""
    out = []
    for sample in samples:
        shares = sample.busy
        mine = (
            [shares[c] for c in cpus if c in shares]
            if isinstance(cpus, list)
            else [*shares.values()]
        )
        out.append((sample.at_ms, sum(mine) / len(mine) if mine else 0.0))
    return out


def _worst_seconds(
    by_second: dict[str, dict[str, float]],
    first_due: float,
    series: dict[str, list[tuple[float, float]]],
    count: int = 5,
) -> list[dict[str, float]]:
    """The ``count`` seconds with the highest error p99 (windows due in them), each with the
    largest value of every ``series`` ((monotonic ms, value) samples) from its start to one
    second after its end (a late command arrives after its second): whose delay the tail was
    (a board worker's long loop turn, a broker stall, a saturated CPU on either side).
    ``by_second``: :func:`_by_second`'s figures, whose seconds count from ``first_due``."""
    worst = sorted(by_second, key=lambda sec: -by_second[sec]["p99"])[:count]

    def largest(samples: list[tuple[float, float]], second: int) -> float:
        lo = first_due + second * 1000
        return max((v for at, v in samples if lo <= at < lo + 2000), default=0.0)

    return [
        {
            "second": int(sec),
            "error_p99_ms": by_second[sec]["p99"],
            "windows": by_second[sec]["count"],
            **{name: round(largest(samples, int(sec)), 2) for name, samples in series.items()},
        }
        for sec in worst
    ]


def _by_second(due_ms: list[float], errors: list[float]) -> dict[str, dict[str, float]]:
    first = min(due_ms, default=0.0)  # the same origin as run()'s first_due
    buckets: dict[int, list[float]] = {}
    for due, error in zip(due_ms, errors, strict=True):
        buckets.setdefault(int((due - first) // 1000), []).append(error)
    return {str(second): summary(values) for second, values in sorted(buckets.items())}


def quantile_stats(figures: dict[str, float], name: str) -> dict[str, float]:
    """``{stat: value}`` of one of the gateway's quantile gauges (``snlpgw_<name>{stat=…}``)."""
    prefix = f"snlpgw_{name}{{"
    return {k.split("stat=")[1].strip('"}'): v for k, v in figures.items() if k.startswith(prefix)}


async def settled(pid: int, *, share: float = 0.05, limit_s: float = 60.0) -> None:
    """Until ``pid`` used under ``share`` of a core over a second (at most ``limit_s``)."""
    for _ in range(int(limit_s)):
        before = cpu_s(pid)
        await asyncio.sleep(1.0)
        if cpu_s(pid) - before < share:
            return


def speaking(speech: dict[str, Any] | None, broker: Broker) -> dict[str, Any]:
    """A board worker's ``speech`` spec section (its hellos go on the gateway's account)."""
    if not speech:
        return {}
    return {"speech": {**speech, "password": broker.gateway_credentials().password}}


def speech_figures(
    found: list[dict[str, Any]], figures: dict[str, float], cpu: dict[str, float]
) -> dict[str, Any]:
    """Assessment figures of a speaking run: close → assessment, shed, ASR CPU."""
    spoken = [f["speech"] for f in found]
    latencies = [x for s in spoken for x in s["close_to_assessment_ms"]]
    from_window = [x for s in spoken for x in s["window_close_to_assessment_ms"]]
    published = figures.get("snlpgw_assessments_published_total", 0.0)
    shed = sum(v for k, v in figures.items() if k.startswith("snlpgw_assessments_shed_total"))
    asr_cpu = sum(v for k, v in cpu.items() if k.startswith("asr") and k.endswith("_cpu_s"))
    return {
        "speech": {
            "answers_started": sum(s["answers_started"] for s in spoken),
            "answers_overlapping": sum(s["answers_overlapping"] for s in spoken),
            "sessions_opened": sum(s["sessions_opened"] for s in spoken),
            "packets_sent": sum(s["packets_sent"] for s in spoken),
            "send_errors": sum(s["send_errors"] for s in spoken),
            "answer_ms": spoken[0]["answer_ms"],
            "drain_s": round(max(s["drain_s"] for s in spoken), 1),
        },
        # utterances the gateway heard and handed to ASR (≤ answers spoken: a window that
        # closed before its answer ended hears less)
        "utterances_heard": int(figures.get("snlpgw_asr_jobs_queued_total", 0.0)),
        "assessments_published": int(published),
        "assessments_received": len(latencies),
        "assessments_shed": int(shed),
        "shed_share": round(shed / max(1.0, shed + published), 3),
        # the answer's speech end (its utterance's close) → the assessment at a backend
        "close_to_assessment_ms": summary(latencies),
        "window_close_to_assessment_ms": summary(from_window),
        "assessments_unmatched": sum(s["assessments_unmatched"] for s in spoken),
        # over the run's wall time (the lessons and the drain after them: ASR busy all along)
        "assessments_per_s": round(published / cpu["wall_s"], 2) if cpu["wall_s"] else 0.0,
        "asr_cpu_s": round(asr_cpu, 2),
        "assessments_per_asr_cpu_s": round(published / asr_cpu, 2) if asr_cpu else 0.0,
        "gateway_metrics": {
            k: v
            for k, v in figures.items()
            if k.startswith(("snlpgw_assessments", "snlpgw_asr", "snlpgw_udp", "snlpgw_voice"))
        },
    }
