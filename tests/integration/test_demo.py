"""`make demo` end to end: real Mosquitto, the composed gateway, both simulators, espeak speech.

The demo's own coroutine runs the lesson (right, wrong, silent, right readings); the test checks
what a user would read: the lesson completed, four steps stored, and the metrics that arrived.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.demo import STEPS, run_demo

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _similarity(metrics: list[dict[str, object]]) -> float:
    values = [m["value"] for m in metrics if m["method"] == "text_similarity_v0"]
    assert len(values) == 1, metrics
    value = values[0]
    assert isinstance(value, float)
    return value


async def test_demo_lesson_runs_to_completion(tmp_path: Path) -> None:
    lines: list[str] = []
    result = await run_demo(data_dir=tmp_path, write=lines.append)

    assert result.completed
    assert result.stored["instance"]["state"] == "completed"
    steps = result.stored["steps"]
    assert [s["clip"] for s in steps] == [s.clip for s in STEPS]
    # Right readings score high, the wrong one low, the silent step is not assessed.
    assert sorted(result.assessments) == [0, 1, 3]
    assert _similarity(steps[0]["metrics"]) >= 0.8
    assert _similarity(steps[1]["metrics"]) <= 0.5
    assert _similarity(steps[3]["metrics"]) >= 0.8
    assert (steps[2]["asr_text"], steps[2]["metrics"]) == (None, [])
    assert _similarity(result.assessments[0]["metrics"]) == _similarity(steps[0]["metrics"])
    assert all(s["window_closed_ms"] is not None for s in steps)
    # The printed timeline and table name every step's window and the outcome.
    text = "\n".join(lines)
    assert text.count("listen window closed") == len(STEPS)
    assert "lesson completed" in text
    assert "state=completed steps=4" in text
    assert "text_similarity_v0=" in text
    # Then a lesson exited mid-way returns to CHAT, and a spoken chat turn is answered.
    assert "lesson cancelled (stopped): back in CHAT" in text
    assert result.chat_reply
    assert "Opus frames played" in text


def test_demo_module_fails_clearly_without_espeak(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # no espeak-ng, sox or mosquitto on PATH
    done = subprocess.run(
        [sys.executable, "-m", "devstack.demo"],
        env=env,
        cwd=Path(__file__).parents[2],  # the dev stack runs from a checkout
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "demo failed" in done.stderr
    assert "espeak-ng" in done.stderr
