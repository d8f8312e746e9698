"""The inline budget benchmark (bench/inline_budget.py) end to end at its smallest: two devices
in two worker processes, one round each of the arithmetic task, the gateway in its own process
on a real Mosquitto with the embedded engines (pocketsphinx, espeak-ng, phrases prepared), and
the result files carry every figure bench/results/inline_budget.md is read for. No figure is
judged here (timing is the benchmark's business, not a test's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
def test_one_device_two_rounds_produces_the_budget_figures(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.inline_budget",
            "--cases",
            "2:1",
            "--reaction-ms",
            "400",
            "--device-workers",
            "2",
            "--presynth-nice",  # the gateway is ready once its phrases are prepared: not at
            "0",  # nice 19, which a CPU hog on the CI machine would starve
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((tmp_path / "inline_budget.json").read_text())
    (case,) = doc["cases"]
    assert case["n"] == 2
    assert case["device_workers"] == 2
    assert doc["reaction_ms"] == 400
    assert case["devices_failed"] == 0, case["failures"]
    assert case["rounds_answered"] == 2
    # Every answered round got its feedback's first frame at the device, after the listen end
    # stamp was seen: both latency figures have two samples.
    assert case["rounds_with_feedback_frame"] == 2
    for figure in ("listen_end_to_first_feedback_ms", "last_answer_packet_to_first_feedback_ms"):
        latency = case[figure]
        assert latency["count"] == 2
        assert latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["max"]
    assert case["neutral_line_rounds"] in (0, 1, 2)
    assert case["answers_per_s_offered"] > 0
    cpu = case["cpu"]
    assert cpu["wall_s"] > 0
    for group in ("gateway", "asr_workers", "speak_subprocesses", "device_workers", "broker"):
        assert cpu[f"{group}_cpu_s"] >= 0
    assert cpu["device_workers_cpu_s"] > 0  # measured in the workers, reported back
    # The embedded ASR transcribed both answers (the warm-up jobs ran before the case).
    assert case["asr_metrics"]["asr_jobs_done_total"] >= 2
    # The catalog's phrases were prepared before the devices started: the lesson's lines
    # (intro, questions, feedback) came from the phrase cache.
    assert case["phrases_prepared"] > 100
    assert case["speech_metrics"]["speech_cache_misses_total"] == 0
    assert case["speech_metrics"]["speech_cache_hits_total"] >= 2 * 4
    table = (tmp_path / "inline_budget.md").read_text()
    assert "| 2 | staggered | 2/2 |" in table
