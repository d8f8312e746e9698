"""End-to-end assessment latency: how long after a listen window closes is its assessment
published, for ~3 s utterances, with the default engine (pocketsphinx, one worker process)?

Everything is real (Mosquitto, gateway, board and Xiaozhi simulators, espeak-ng speech over
encrypted UDP, VAD, ASR, SQLite). The clock steps the lesson; the runtime hands an utterance to
ASR as soon as the VAD closes it, so an assessment can even be published before its window
closes (negative figures). Run: ``.venv/bin/python -m bench.assessment_bench``; writes
bench/results/assessment.json and .md.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path

from gateway.assessment.sphinx import PocketsphinxEngine
from tests.support.broker import new_device_id, start_broker
from tests.support.speech import synthesize
from tests.support.voice_lesson import child, lesson_rig, start

OUT = Path(__file__).parent / "results"
LESSONS = 2
CLIP_MS = 2800  # window = 1.5 x 2800 = 4200 ms: room for a 3 s reading and its tail
# ~3 s readings: the expected sentence with extra words around it
SCRIPT: dict[int, str | None] = {
    0: "Good morning, good morning to you my friend.",
    1: "How are you, how are you today my friend?",
    2: "I am fine, thank you, I am fine today.",
    3: "See you later, alligator, see you later.",
}


async def one_lesson(broker_dir: Path, work: Path) -> list[dict[str, float]]:
    broker = start_broker(broker_dir)
    try:
        device_id = new_device_id()
        async with lesson_rig(broker, work, device_id, PocketsphinxEngine, clip_ms=CLIP_MS) as (
            _gw,
            seen,
            device,
            backend,
        ):
            async with asyncio.TaskGroup() as tg:
                reader = tg.create_task(child(device, seen, SCRIPT), name="bench.child")
                await start(backend, device_id, seen)
                await seen.until(lambda: bool(seen.named("instance.completed")), 120)
                await reader
            await seen.until(lambda: len(seen.assessments) >= len(SCRIPT), 60)
        closed = {
            e["step_index"]: e["data"]["actual_close_ms"] for e in seen.named("window.closed")
        }
        spoken = {
            e["step_index"]: e["data"]["duration_ms"]
            for e in seen.named("speech.stopped")
            if e.get("step_index") is not None
        }
        return [
            {
                "step": a["step_index"],
                "utterance_ms": float(spoken.get(a["step_index"], 0)),
                "after_close_ms": float(a["assessed_at"] - closed[a["step_index"]]),
                "similarity": float(a["metrics"][0]["value"]) if a["metrics"] else -1.0,
            }
            for a in seen.assessments
        ]
    finally:
        broker.stop()


async def main() -> dict[str, object]:
    for text in SCRIPT.values():
        assert text is not None
        synthesize(text)  # warm the speech cache outside the measurement
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="snlpgw-bench-") as tmp:
        for i in range(LESSONS):
            rows += await one_lesson(Path(tmp) / f"broker{i}", Path(tmp) / f"work{i}")
    after = sorted(r["after_close_ms"] for r in rows)
    return {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "engine": "pocketsphinx (default), 1 worker process",
        "assessments": len(rows),
        "utterance_ms_mean": round(statistics.mean(r["utterance_ms"] for r in rows)),
        "published_after_window_close_ms": {
            "p50": round(statistics.median(after)),
            "max": round(after[-1]),
            "min": round(after[0]),
        },
        "target_ms": 3000,
        "rows": rows,
    }


def write(result: dict[str, object]) -> None:
    OUT.mkdir(exist_ok=True)
    (OUT / "assessment.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    after = result["published_after_window_close_ms"]
    assert isinstance(after, dict)
    lines = [
        "# Assessment latency (end to end)",
        "",
        f"{result['assessments']} assessments of ~{result['utterance_ms_mean']} ms utterances, "
        f"{result['engine']}, {result['machine']}.",  # type: ignore[index]
        "",
        "| published after window close | ms |",
        "|---|---|",
        f"| p50 | {after['p50']} |",
        f"| max | {after['max']} |",
        f"| min | {after['min']} |",
        "",
        f"Target: ≤ {result['target_ms']} ms. Negative: published before the window closed "
        "(the utterance was handed to ASR when the VAD closed it).",
        "",
    ]
    (OUT / "assessment.md").write_text("\n".join(lines), encoding="utf-8")


if __name__ == "__main__":
    outcome = asyncio.run(main())
    write(outcome)
    print(json.dumps({k: v for k, v in outcome.items() if k != "rows"}, indent=2))
