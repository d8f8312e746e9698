"""The markdown page of a harness run (bench/results/load/load.md)."""

from __future__ import annotations

import math
from typing import Any


def _q(s: dict[str, Any], key: str) -> str:
    return "-" if not s.get("count") else f"{s[key]:.1f}"


def _num(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.0f}"


def placement_text(doc: dict[str, Any]) -> str:
    runs = [*doc.get("lessons", []), doc.get("hellos")]
    where = next((r["placement"] for r in runs if r and "placement" in r), None)
    if where is None:
        return ""
    if where["gateway_cpus"] == "shared":
        return "The gateway shared every CPU with the broker and the workers (`--shared-cores`)."
    return (
        f"Lessons and hellos: the gateway's process ran on CPU {where['gateway_cpus']} alone, the "
        f"broker and the workers on CPU {where['others_cpus']}: the latency targets are per "
        "gateway core, and unplaced the scheduler put the harness's own work on the gateway's CPU "
        "at times (`--shared-cores` leaves it there; `procs.place_gateway`). Streaming is not "
        "placed: its figure is CPU per frame against a floor on the same thread, and placed runs "
        "only moved the datagrams' wake-ups across CPUs (`placement-ab.md`)."
    )


def _host(host: dict[str, Any] | None) -> str:
    if not host:
        return ""
    return (
        f" CPU: {host['cpu_model'] or 'unknown model'}; a fixed pure-Python workload "
        f"(`host_speed`) took {host['python_workload_ms']} ms, the yardstick for comparing "
        "runs on different hosts."
    )


def markdown(doc: dict[str, Any]) -> str:
    lb, la = doc["load_before"], doc["load_after"]
    out = [
        "# Load harness (`make load`, `python -m bench.load`)\n",
        f"Run {doc['started_utc']} on {doc['machine']}, {lb['cpus']} CPUs **shared with other "
        f"work**: load average before {lb['loadavg_1_5_15']}, machine busy "
        f"{lb['busy_share_before_run']:.0%} in the second before the run "
        f"(after: {la['loadavg_1_5_15']}). *others* below is CPU (cores) used by processes "
        "outside the run while it was measured."
        + _host(doc.get("host"))
        + (" **Quick (smoke) sizes.**" if doc["quick"] else "")
        + "\n",
        "Every phase: Mosquitto with the project's generated config, the gateway "
        "(`gateway.app.build_gateway`, ASR off) in its own process, simulated boards/devices in "
        "worker processes with one real MQTT connection each; loopback only. "
        + placement_text(doc)
        + "\n",
    ]
    if "stream" in doc:
        out += stream_section(doc["stream"])
    if "lessons" in doc:
        out += lessons_section(doc["lessons"])
    if doc.get("hellos"):
        out += hellos_section(doc["hellos"])
    out.append(
        "Plots: `latency_cdf.png` (CDFs of both latency figures), `cpu_vs_n.png` (CPU vs N).\n"
    )
    return "\n".join(out)


def stream_section(s: dict[str, Any]) -> list[str]:
    f, alone = s["floor"], s["floor_alone"]
    rows = [
        "## Streaming: gateway vs floor\n",
        "Floor: AES-128-CTR via `cryptography`, `opus_decode` via ctypes, two webrtcvad "
        "decisions per 60 ms frame, in a bare loop, measured **on the gateway's own thread** "
        "during each run's window (a 60-frame pass between its loop's turns every 0.5 s, its CPU "
        "taken out of the gateway's): same core, same seconds, same neighbours as the gateway. "
        f"Measured alone (before each run and after the last) it was {alone['us_per_frame_median']}"
        f" µs per frame at best ({', '.join(str(x['us_per_frame_median']) for x in s['floors_alone'])}"
        "): this host's speed without the gateway's neighbours.\n",
        "| sessions | gateway CPU | µs per frame | sessions/core | floor on its thread µs | "
        "x that floor | sent | received | dropped | others | zero drops |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in s["runs"]:
        drops = int(sum(r["dropped_in_gateway"].values()) + r["audio_queue_dropped"])
        us = r["gateway_us_per_frame"]
        per_core = int(60_000 / us) if us else "-"
        rows.append(
            f"| {r['sessions']} | {r['gateway_core_share']:.0%} | {us} | {per_core} | "
            f"{r['thread_floor']['us_per_frame_mean']} | {r['thread_ratio'] or '-'} | "
            f"{r['datagrams_sent']} | {int(r['datagrams_received'])} | {drops} | "
            f"{r['others_core_share']:.2f} | {'yes' if r['zero_drops'] else 'NO'} |"
        )
    rows += [
        "",
        f"**Gateway: {s['gateway_sessions_per_core']} sessions/core "
        f"({s['gateway_us_per_frame']} µs per frame at {s['gateway_best_run_sessions']} sessions"
        f"{'' if s['gateway_best_run_zero_drops'] else ', NOT drop-free'}) = "
        + (
            f"{s['ratio_to_floor']} x the floor on its thread ({f['us_per_frame_mean']} µs, "
            f"{f['sessions_per_core']} sessions/core)**"
            if s["ratio_to_floor"]
            else "? x the floor: no floor pass fell in its window**"
        )
        + " (target ≥ 0.75); against the floor measured "
        f"alone, {s['ratio_to_floor_alone']} x. Largest K with zero drops: "
        f"{s['largest_k_zero_drops']}.\n",
        "Sessions/core = 60 ms / CPU time per decoded frame (process CPU time over the window, "
        "all threads, less the floor passes'), so other processes on the machine change it less "
        "than wall-clock figures; *received < sent* means the kernel dropped datagrams while the "
        "gateway process was not scheduled (the receive buffer holds ~0.3 s at 200 sessions).\n",
    ]
    return rows


def lessons_section(runs: list[dict[str, Any]]) -> list[str]:
    if not runs:
        return []
    r0 = runs[0]
    rows = [
        "## Lessons: audio.completed → next PLAY_MEDIA, measured at the boards\n",
        f"Shadowing lessons of {r0['clips']} clips x {r0['clip_ms']} ms, window "
        f"{r0['window_ms']:.0f} ms (SPEC formula). Error = PLAY_MEDIA received - (audio.completed "
        "published + window), both on the board's clock: both MQTT hops, the gateway's work "
        "and timer lateness. Staggered: starts spread over one step; simultaneous: all at once.\n",
        "| lessons | start | steps | error p50 | p99 | max | start → first play p50 / p99 "
        "| completed → LISTEN_START p50 / p99 | last window → LISTEN_STOP p99 | gateway timer lateness p99 | broker round trip "
        "p99 / max | gateway CPU | CPU ms/step | broker CPU | boards CPU s "
        "| board loop lag p99 | RSS/lesson KB | GC full pause max | others |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        first = r.get("start_to_first_play_ms", {})
        opened = r.get("completed_to_listen_start_ms", {})
        rtt = r.get("broker_round_trip_ms", {})
        e, last, lag = (
            r["completed_to_next_play_error_ms"],
            r["last_window_to_listen_stop_error_ms"],
            r["board_worker_loop_lag_ms"],
        )
        rows.append(
            f"| {r['lessons']} | {r['start']} | {r['steps_measured']}/{r['steps_expected']} | "
            f"{_q(e, 'p50')} | {_q(e, 'p99')} | {_q(e, 'max')} | "
            f"{_q(first, 'p50')} / {_q(first, 'p99')} | "
            f"{_q(opened, 'p50')} / {_q(opened, 'p99')} | {_q(last, 'p99')} | "
            f"{_num(r['gateway_window_lateness_ms'].get('p99'))} | "
            f"{_q(rtt, 'p99')} / {_q(rtt, 'max')} | "
            f"{r['gateway_core_share']:.0%} | {r['gateway_cpu_ms_per_step']} | "
            f"{r['broker_core_share']:.0%} | "
            f"{r['board_workers_cpu_s']} | {_q(lag, 'p99')} | {r['gateway_rss_per_lesson_kb']} | "
            f"{_num(r.get('gateway_gc_full_pause_ms', {}).get('max'))} | "
            f"{r['others_core_share']:.2f} |"
        )
    rows += [
        "",
        "All latencies in ms. Target: p99 ≤ 50 ms at 1,000 lessons on one gateway core. "
        "*start → first play*: the start request published to the lesson's first PLAY_MEDIA "
        "received: what the gateway's start admission (`runtime.start_rate_per_s`, 500 a "
        "second after a burst of 20) costs a herd of starts; spreading them once spreads every "
        "step after them. "
        "*completed → LISTEN_START*: audio.completed published to the window's LISTEN_START "
        "received, how long the gateway took to answer it (both hops, its queue and its "
        "outbound path); the window's deadline is set when the gateway handles the completed, "
        "so only the inbound hop and the queue before that are part of the error (a "
        "LISTEN_START missing before the play is counted in the JSON, `listen_start_missing`, "
        "not averaged in). "
        "*gateway timer lateness*: the gateway's own window timer (fired - planned, its metric, "
        "which keeps the last 2,048 windows: the run's end, not its worst seconds). "
        "*broker round trip*: a harness client publishing to itself every 20 ms (QoS 0): the "
        "broker's own delays (`bench/load/probe.py`; stalls over 30 ms listed below). "
        "*CPU ms/step*: gateway CPU over the run / clip steps the boards saw through: what one "
        "clip step "
        "(3 commands, their acks, 2 board events, task events, store writes) costs. "
        "*board loop lag*: how late the board workers' own event loops woke (their share of "
        "the figure). RSS/lesson: (peak - idle) gateway RSS / lessons. *GC full pause max*: the "
        "gateway's longest full garbage collection (`snlpgw_gc_full_pause_ms`).\n",
    ]
    stalled = [r for r in runs if r.get("broker_stalls") or r.get("broker_probe_error")]
    if stalled:
        rows.append(
            "Broker probe: round trips over 30 ms (seconds from the first window due, as below), "
            "and a probe that stopped early:\n"
        )
        for r in stalled:
            text = "; ".join(r.get("broker_stalls") or [])
            if r.get("broker_probe_error"):
                text += f" (probe stopped: {r['broker_probe_error']})"
            rows.append(f"- {r['lessons']} {r['start']}: {text}")
        rows.append("")
    largest = max(r["lessons"] for r in runs)
    worst = [r for r in runs if r.get("worst_seconds") and r["lessons"] == largest]
    if worst:
        rows += [
            "The five seconds with the highest error p99 (by when their windows were due, from "
            "the first), each with the largest value from its start to the next second's end "
            "of: the board workers' longest loop turn and the broker probe's round trip (ms); "
            "the gateway process's CPU in a 100 ms sample (cores); the others' CPUs' busy share "
            "(every CPU's when the run was not placed) and the hypervisor's steal over all CPUs "
            "(share). Look for the side that stands out against "
            "quieter seconds of the same run: the gateway's process often reads a full core in "
            "100 ms of mild seconds too.\n",
            "| lessons | start | second | windows | error p99 | board worker lag | broker round "
            "trip | gateway process CPU | others' CPUs busy | steal |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in worst:
            rows += [
                f"| {r['lessons']} | {r['start']} | {w['second']} | {w['windows']} | "
                f"{w['error_p99_ms']:.1f} | {w['board_worker_lag_max_ms']:.1f} | "
                f"{w['broker_round_trip_max_ms']:.1f} | {w['gateway_process_cpu_max']:.2f} | "
                f"{w['others_cpus_busy_max']:.0%} | {w['steal_max']:.0%} |"
                for w in r["worst_seconds"]
            ]
        rows.append("")
    by_clip = [r for r in runs if r.get("completed_to_next_play_error_by_clip_ms")]
    if by_clip:
        clips = list(by_clip[0]["completed_to_next_play_error_by_clip_ms"])
        rows += [
            "Error p99 by the clip whose window closed (clip 1's windows close while later "
            "lessons are still starting):\n",
            "| lessons | start | " + " | ".join(f"after clip {c}" for c in clips) + " |",
            "|---|---|" + "---|" * len(clips),
        ]
        for r in by_clip:
            per = r["completed_to_next_play_error_by_clip_ms"]
            rows.append(
                f"| {r['lessons']} | {r['start']} | "
                + " | ".join(_q(per.get(c, {}), "p99") for c in clips)
                + " |"
            )
        rows.append("")
    return rows


def hellos_section(h: dict[str, Any]) -> list[str]:
    rows = [
        f"## Xiaozhi hello → reply at {h['sessions']} sessions\n",
        "| phase | hellos | rate /s | p50 | p90 | p99 | max | no reply | gateway CPU | others |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for phase in ("staggered", "burst"):
        p = h[phase]
        s = p["hello_to_reply_ms"]
        rate = p["rate_per_s"] if p["rate_per_s"] is not None else "all at once"
        rows.append(
            f"| {phase} | {p['hellos']} | {rate} | {_q(s, 'p50')} | {_q(s, 'p90')} | "
            f"{_q(s, 'p99')} | {_q(s, 'max')} | {p['no_reply']} | {p['gateway_core_share']:.0%} | "
            f"{p['others_core_share']:.2f} |"
        )
    g = h["gateway_handling_ms_last_2048"]
    if g:
        rows.append(
            f"\nGateway-internal handling (receipt → reply queued), last {int(g.get('count', 0))}: "
            f"p50 {g.get('p50', 0):.2f} ms, p99 {g.get('p99', 0):.2f} ms, max {g.get('max', 0):.2f} ms."
        )
    gc_full = h.get("gateway_gc_full_pause_ms") or {}
    if gc_full:
        count = int(gc_full.get("count", 0))
        longest = f", longest {gc_full.get('max', 0):.1f} ms" if count else ""
        rows.append(f"Full garbage collections in the gateway (all phases): {count}{longest}.")
    rows.append(
        "\nDevice publish → reply received, on the device's clock. Target: p99 ≤ 20 ms at "
        "1,000 sessions (staggered: every session open, hellos at a steady rate).\n"
    )
    return rows
