"""ASR benchmark: submit-to-result time and real-time factor of the default engine.

A ~3 s utterance (espeak-ng, three demo sentences) goes through the real pool with one
pocketsphinx worker process, as the gateway runs it. Run: ``.venv/bin/python -m bench.asr_bench``.
Writes bench/results/asr.json and bench/results/asr.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import time
from pathlib import Path

from gateway.assessment.asr_metrics import AsrMetrics
from gateway.assessment.jobs import AsrJob, AsrKey, AsrOutcome, AsrResult, audio_ms
from gateway.assessment.pool import AsrPool
from gateway.assessment.procslot import ProcessBackend
from gateway.assessment.sphinx import PocketsphinxEngine
from gateway.metrics import Metrics
from tests.support.speech import compose

LESSON = ("Good morning.", "How are you?", "I like apples.", "The cat is sleeping.")
RUNS = 20
OUT = Path(__file__).parent / "results"


async def main() -> dict[str, object]:
    pcm = compose(["Good morning.", 150, "I like apples.", 150, "The cat is sleeping."]).pcm
    outcomes: asyncio.Queue[AsrOutcome] = asyncio.Queue()  # unbounded: one job at a time
    pool = AsrPool(
        backend=ProcessBackend(PocketsphinxEngine, name="pocketsphinx"),
        metrics=AsrMetrics(Metrics()),
        on_result=outcomes.put_nowait,
    )
    latencies: list[float] = []
    rtfs: list[float] = []
    texts: set[str] = set()
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(pool.run(), name="bench.asr_pool")
        t0 = time.perf_counter()
        pool.submit(AsrJob(AsrKey("bench", -1, "warm"), pcm, LESSON))
        await outcomes.get()
        warm_ms = (time.perf_counter() - t0) * 1000
        for i in range(RUNS):
            t0 = time.perf_counter()
            pool.submit(AsrJob(AsrKey("bench", i, "u"), pcm, LESSON))
            out = await outcomes.get()
            latencies.append((time.perf_counter() - t0) * 1000)
            assert isinstance(out.result, AsrResult), out
            rtfs.append(out.result.elapsed_ms / out.result.audio_ms)
            texts.add(out.result.text)
        # A lesson seen for the first time builds its decoder (dictionary + language model).
        new_lesson_ms: list[float] = []
        for i in range(5):
            hints = (*LESSON, f"Lesson {i} has a new sentence.")
            t0 = time.perf_counter()
            pool.submit(AsrJob(AsrKey("bench-new", i, "u"), pcm, hints))
            await outcomes.get()
            new_lesson_ms.append((time.perf_counter() - t0) * 1000)
        # Generic path (no lesson sentences): the stock en-us model.
        generic_rtf: list[float] = []
        for i in range(5):
            pool.submit(AsrJob(AsrKey("bench-generic", i, "u"), pcm, ()))
            out = await outcomes.get()
            assert isinstance(out.result, AsrResult), out
            generic_rtf.append(out.result.elapsed_ms / out.result.audio_ms)
        task.cancel()
    ordered = sorted(latencies)
    return {
        "engine": "pocketsphinx (lesson LM), 1 worker process",
        "audio_ms": audio_ms(pcm),
        "runs": RUNS,
        "first_job_incl_worker_start_ms": round(warm_ms, 1),
        "submit_to_result_ms": {
            "p50": round(statistics.median(ordered), 1),
            "p99": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1),
            "max": round(ordered[-1], 1),
        },
        "real_time_factor": {"p50": round(statistics.median(rtfs), 3), "max": round(max(rtfs), 3)},
        "new_lesson_first_job_ms": {
            "p50": round(statistics.median(new_lesson_ms), 1),
            "max": round(max(new_lesson_ms), 1),
        },
        "generic_model_real_time_factor": {
            "p50": round(statistics.median(generic_rtf), 3),
            "max": round(max(generic_rtf), 3),
        },
        "transcripts": sorted(texts),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }


def write(result: dict[str, object]) -> None:
    OUT.mkdir(exist_ok=True)
    (OUT / "asr.json").write_text(json.dumps(result, indent=2) + "\n")
    lat = result["submit_to_result_ms"]
    rtf = result["real_time_factor"]
    assert isinstance(lat, dict)
    assert isinstance(rtf, dict)
    new = result["new_lesson_first_job_ms"]
    gen = result["generic_model_real_time_factor"]
    assert isinstance(new, dict)
    assert isinstance(gen, dict)
    md = [
        "# ASR benchmark (bench/asr_bench.py)",
        "",
        f"Engine: {result['engine']}; utterance {result['audio_ms']:.0f} ms; {result['runs']} runs.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| submit → result p50 | {lat['p50']} ms |",
        f"| submit → result p99 | {lat['p99']} ms |",
        f"| submit → result max | {lat['max']} ms |",
        f"| real-time factor p50 / max | {rtf['p50']} / {rtf['max']} |",
        f"| first job incl. worker start | {result['first_job_incl_worker_start_ms']} ms |",
        f"| first job of a new lesson (decoder build) p50 / max | {new['p50']} / {new['max']} ms |",
        f"| generic model (no lesson) real-time factor p50 / max | {gen['p50']} / {gen['max']} |",
        "",
        f"Target: ≤ 3000 ms submit → result on a 2-core machine. Transcripts: {result['transcripts']}.",
        "",
    ]
    (OUT / "asr.md").write_text("\n".join(md))


if __name__ == "__main__":
    res = asyncio.run(main())
    write(res)
    print(json.dumps(res, indent=2))
