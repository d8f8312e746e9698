"""SPEAK's phrases prepared ahead of use (issue #27 item 3): with ``speech.presynth`` the
gateway synthesizes the catalog's fixed phrases in the background after start, and a STEPS
lesson then says every line from the phrase cache: its intro, its question and the first
feedback (real Mosquitto, espeak-ng, pocketsphinx, the Xiaozhi device simulator).

The child stays silent, so the feedback ("It is N.") does not depend on what the recogniser
hears; the window times out and the feedback for silence is spoken."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from gateway.assessment.sphinx import PocketsphinxEngine
from gateway.speech.phrases import catalog_phrases
from gateway.speech.service import PREPARED_FRAME_MS, PREPARED_RATE
from gateway.tasks.core.loader import load_catalog
from tests.support import voice_lesson
from tests.support.broker import Broker
from tests.support.speech import silence
from tests.support.voice_lesson import lesson_rig

pytestmark = pytest.mark.integration


@pytest.fixture
def arithmetic_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shipped catalog's arithmetic task alone, one round (its 123 lines prepared)."""
    root = tmp_path / "catalog"
    shutil.copytree(voice_lesson.CATALOG, root)
    file = root / "thinking_games.json"
    tasks = [t for t in json.loads(file.read_text()) if t["task_id"] == "arithmetic_10"]
    for step in tasks[0]["steps"]:
        if step["type"] == "generate":
            step["rounds"] = 1
    file.write_text(json.dumps(tasks, ensure_ascii=False))
    monkeypatch.setattr(voice_lesson, "CATALOG", root)
    return root


@pytest.mark.timeout(420)
async def test_the_first_feedback_comes_from_the_prepared_phrases(
    broker: Broker, tmp_path: Path, device_id: str, arithmetic_only: Path
) -> None:
    async with lesson_rig(
        # presynth_nice 0: the test waits for the preparation; at nice 19 (the default) it only
        # gets what the machine leaves idle, and a CI machine under a CPU hog leaves none.
        broker,
        tmp_path,
        device_id,
        PocketsphinxEngine,
        speech={"presynth": True, "presynth_nice": 0},
    ) as (gw, seen, device, backend):
        speech = gw.speech
        assert speech is not None
        phrases = catalog_phrases(load_catalog(arithmetic_only).catalog, frozenset({"en", "zh"}))
        async with asyncio.timeout(300):  # a hang guard: ~123 espeak-ng runs on a busy machine
            await speech.prepared.wait()
        assert len(speech.cache) >= len(phrases)
        figures = gw.service.metrics.snapshot()
        assert figures["snlpgw_speech_prepared_phrases"] == len(phrases)
        hits, misses = speech.cache.hits, speech.cache.misses
        # SPEAK learns the device's UDP address from its first datagram
        await device.stream_pcm(silence(120), speed=4.0)

        request = {"v": 1, "id": "r1", "action": "start", "app_id": "thinking_games",
                   "task_id": "arithmetic_10", "priority": 3, "params": {"seed": 7}}  # fmt: skip
        await backend.publish(f"snlpgw/v1/ctl/{device_id}", json.dumps(request))
        await seen.until(lambda: bool(seen.named("instance.completed")), 120)
        said = [m["text"] for m in device.inbox if m.get("state") == "sentence_start"]

    question = next(t for t in said if t.startswith("What is"))
    a, op, b = question.removeprefix("What is ").removesuffix("?").split()
    answer = int(a) + int(b) if op == "plus" else int(a) - int(b)
    assert said == ["Ten questions.", "Say the answer.", question, f"It is {answer}."]
    # every line of the lesson, the feedback included, was served from the cache
    assert speech.cache.misses == misses
    assert speech.cache.hits == hits + 4
    key_format = (PREPARED_RATE, PREPARED_FRAME_MS)
    assert {(k.sample_rate, k.frame_ms) for k in speech.cache._entries} == {key_format}
