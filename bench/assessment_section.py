"""The "with the lessons running" section of bench/results/assessment_scale.md, rendered from
bench/results/assessment_lessons.json (written by :mod:`bench.assessment_lessons`); apart so
both benchmarks render it without importing each other."""

from __future__ import annotations

import json
from typing import Any

from bench.stats import RESULTS

NAME = "assessment_lessons"


def committed_section() -> list[str]:
    """The section from the committed JSON, or nothing before the first run."""
    path = RESULTS / f"{NAME}.json"
    if not path.exists():
        return []
    return section(json.loads(path.read_text(encoding="utf-8")))


def _every(k: int) -> str:
    return "every window" if k == 1 else f"1 window of {k}"


def section(doc: dict[str, Any]) -> list[str]:
    """The "with the lessons running" section of assessment_scale.md."""
    cond = doc["conditions"]
    lines = [
        "## With the lessons running (bench/assessment_lessons.py)",
        "",
        f"Run {doc['started']}. One run carries both figures: the load harness's lessons phase "
        f"(N shadowing lessons of {doc['clips']} clips x 1500 ms, window 1800 ms, staggered over "
        "one step; Mosquitto; the gateway in its own process on CPU "
        f"{doc['cases'][0]['placement']['gateway_cpus']} alone) with **assessment on**: "
        "`asr.engine=http` against a fresh `snlpgw asr-serve --workers 1` per case (placed with "
        "the broker and the board workers on the other CPU, at nice 19: it stands in for an ASR "
        "host of its own and must not starve the boards that measure), gateway queue "
        f"{doc['queue_limit']} (oldest shed), 2 requests in flight. Every board answers every "
        "window with real espeak-ng speech over its own Xiaozhi voice session (encrypted UDP, "
        "60 ms Opus packets pre-encoded once, sealed per packet at send time; "
        f"{doc['answer_ms']} ms per answer incl. {doc['lead_ms']} ms lead and {doc['tail_ms']} ms tail "
        "silence); the gateway decodes, runs its VAD and attributes each utterance to the "
        "board's lesson by device id. *archive*: each answer also kept as Ogg Opus "
        "(`archive.enabled`, the default) or not.",
        "",
        "Columns: *next-clip error* = PLAY_MEDIA received - (audio.completed published + "
        "window), at the boards (bench/results/load/load.md; target p99 ≤ 50 ms); *heard* = "
        "utterances the gateway's VAD closed and handed to ASR (a window that closes before "
        "its answer is over hears nothing); *close→assessment* = the end of the answer's speech "
        "(the utterance's close; the VAD adds its 300 ms of silence) → the step's assessment "
        "received by a backend client, for what is assessed (`window_close_to_assessment_ms` "
        "in the JSON: from the window's close instead); *shed* = the gateway's "
        "`assessments_shed_total`: steps stored with `assessment_shed = queue_full` (the ASR "
        "queue), `asr_saturated` (windows the ASR had no place for when they opened, "
        "gateway/assessment/claims.py) or `voice_overload` (windows the gateway's loop had no "
        "time to decode, gateway/xiaozhi/overload.py): the last two captured undecoded, their "
        "audio archived for `snlpgw reassess`; share of "
        "shed + assessed; *assessments/s* = assessed / the case's wall time (lessons and drain); *per ASR "
        "core* = that / "
        "ASR workers (1); *per ASR CPU-second* = assessed / CPU the asr-serve process and its "
        "worker used (what a core of their own gives); *gateway CPU* = the gateway processes' "
        "CPU over the case's wall time (one gateway: the share of its core); *gateway CPU "
        "ms/step* = their CPU / clip steps. *on 2 gateways*: two gateway processes in cluster "
        "mode (docs/scale-out.md) on one PostgreSQL, each owning about half the boards; placed "
        "on CPUs of their own only when a CPU is left for the rest, shared otherwise.",
        "",
        f"Machine before the run: load average {cond['loadavg_1_5_15']}, busy share "
        f"{cond['busy_share_before_run']} ({cond['cpus']} CPUs shared with other developers). "
        "*others* = CPU (cores) used by processes outside the run while it was measured.",
        "",
    ]
    lines += _table(doc["cases"])
    lines += _late_table(doc["cases"])
    for later in doc.get("later_runs", []):
        c = later["conditions"]
        lines += [
            "",
            f"Re-run {later['started']} (load average before {c['loadavg_1_5_15']}, busy share "
            f"{c['busy_share_before_run']}):",
            "",
            *_table(later["cases"]),
        ]
    for note in doc["notes"]:
        lines += ["", note]
    return lines


def _late_table(cases: list[dict[str, Any]]) -> list[str]:
    """Whose lateness the next-clip error is: the gateway's or the board workers' (runs that
    recorded the split; nothing for older results)."""
    split = [c for c in cases if "next_play_error_gateway_part_ms" in c]
    if not split:
        return []
    lines = [
        "",
        "Who was late: the next-clip error cut at the gateway's own stamp in each PLAY_MEDIA "
        "(`ts`, its wall clock when it built the command): *gateway part* = stamp - "
        "(audio.completed published + window) (the completed on its way in, the gateway's "
        "queue and window timer); *delivery part* = received - stamp (the gateway's publish, "
        "the broker, the board worker's loop noting the receipt: a lagging board worker shows "
        "here only, beside the gateway's own publish and the broker); *worker lag at receipt* = "
        "the board worker's loop lag in the 50 ms around each PLAY_MEDIA's receipt (its share "
        "of the delivery part); the gateway's own `window_lateness_ms`; the board workers' loop "
        "lag over the run (50 ms sleeps, how late they woke) and their CPU.",
        "",
        "| lessons | next-clip error p99 | gateway part p50 | **p99** | delivery part p50 "
        "| **p99** | worker lag at receipt p99 | gateway window lateness p99 "
        "| board worker lag p99 | max | board workers CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in split:
        gw, hop = c["next_play_error_gateway_part_ms"], c["next_play_error_delivery_part_ms"]
        lag, late = c["board_worker_loop_lag_ms"], c.get("gateway_window_lateness_ms", {})
        p99 = late.get("p99")
        lines.append(
            f"| {_lessons(c)} | {c['completed_to_next_play_error_ms'].get('p99', '-')} "
            f"| {gw.get('p50', '-')} | **{gw.get('p99', '-')}** | {hop.get('p50', '-')} "
            f"| **{hop.get('p99', '-')}** "
            f"| {c.get('next_play_worker_lag_ms', {}).get('p99', '-')} "
            f"| {'-' if p99 is None else round(p99, 1)} "
            f"| {lag.get('p99', '-')} | {lag.get('max', '-')} "
            f"| {c.get('board_workers_cpu_s', '-')} |"
        )
    return lines


def _table(cases: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| lessons | speaks in | archive | steps | next-clip error p50 | **p99** | max | answers spoken | heard "
        "| assessed "
        "| shed (share) | close→assessment p50 | p99 | assessments/s | per ASR core "
        "| per ASR CPU-second | ASR CPU s | gateway CPU | gateway CPU ms/step | others | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        nxt, lat = c["completed_to_next_play_error_ms"], c["close_to_assessment_ms"]
        lines.append(
            f"| {_lessons(c)} | {_every(c.get('speak_every', 1))} | {c.get('archive', 'on')} "
            f"| {c['steps_measured']}/{c['steps_expected']} "
            f"| {nxt.get('p50', '-')} | **{nxt.get('p99', '-')}** | {nxt.get('max', '-')} "
            f"| {c['speech']['answers_started']} | {c.get('utterances_heard', '-')} "
            f"| {c['assessments_published']} "
            f"| {c['assessments_shed']} ({c['shed_share']:.0%}{_overload(c)}) "
            f"| {lat.get('p50', '-')} "
            f"| {lat.get('p99', '-')} | {c['assessments_per_s']} "
            f"| {c['assessments_per_s'] / c['asr_workers']:.2f} "
            f"| {c['assessments_per_asr_cpu_s']} | {c['asr_cpu_s']} "
            f"| {_gateway_share(c)} | {c['gateway_cpu_ms_per_step']} "
            f"| {c.get('others_core_share', 0):.2f} "
            f"| {c['wall_s']:.1f} |"
        )
    return lines


def _lessons(case: dict[str, Any]) -> str:
    links, gateways = case.get("publish_links", 0), case.get("gateways", 1)
    return (
        f"{case['lessons']}"
        + (f" (+{links} publish links)" if links else "")
        + (f" on {gateways} gateways (cluster, PostgreSQL)" if gateways > 1 else "")
    )


def _gateway_share(case: dict[str, Any]) -> str:
    """Every gateway process's CPU over the case, in cores (one gateway: its share of its)."""
    if "gateways_cpu_s" not in case:
        return f"{case.get('gateway_core_share', 0):.0%}"
    return f"{case['gateways_cpu_s'] / case['wall_s']:.0%}"


def _overload(case: dict[str, Any]) -> str:
    """The voice-overload share of the shed (windows captured undecoded), where recorded."""
    shed = case.get("gateway_metrics", {}).get(
        "snlpgw_assessments_shed_total{reason=voice_overload}"
    )
    return f"; {int(shed)} voice overload" if shed else ""
