"""The assessment side path with the real ASR pool (pocketsphinx worker) and a real store."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.assessment.procslot import ProcessBackend
from gateway.assessment.sphinx import PocketsphinxEngine
from gateway.http import HttpServer
from gateway.metrics import Metrics
from gateway.service import Context, Ops
from gateway.settings import AsrSettings, load_settings
from gateway.store import InstanceRecord, InstanceState, Store
from gateway.tasks.assessing import AssessmentPath
from tests.support.speech import synthesize
from tests.unit.tasks.fakes import FakeMqtt

DEV = "aa_bb_cc_dd_ee_03"
LESSON = ("Good morning.", "How are you?", "I am fine, thank you.")


async def test_no_expected_text_gives_null_and_no_metrics(tmp_path: Path) -> None:
    metrics, mqtt = Metrics(), FakeMqtt()
    store = Store(path=tmp_path / "gw.sqlite3")
    path = AssessmentPath(
        settings=AsrSettings(workers=1),
        store=store,
        backend=ProcessBackend(PocketsphinxEngine, name="pocketsphinx"),
    )
    http = HttpServer(host="127.0.0.1", port=0, metrics=metrics)
    ctx = Context(load_settings(), mqtt, http, metrics, Ops("gw", mqtt, metrics))  # type: ignore[arg-type]
    store.attach(ctx)
    path.attach(ctx)
    heard: list[tuple[str, str, int, str]] = []
    path.on_text = lambda *args: heard.append(args)
    async with asyncio.TaskGroup() as tg:
        tasks = [
            tg.create_task(store.run(), name="t.store"),
            tg.create_task(path.run(), name="t.asr"),
        ]
        store.submit_instance(InstanceRecord("i1", device_id=DEV, state=InstanceState.RUNNING))
        for step, expected in enumerate((None, "Good morning.")):
            path.submit_utterance(
                device=DEV,
                instance_id="i1",
                step_index=step,
                utterance_id=f"u{step}",
                pcm=synthesize("Good morning."),
                prompt_text=f"/english_learning/shadowing/lessons/unit01/0{step + 1}.mp3",
                expected_text=expected,
                methods=("text_similarity_v0",),
                hints=LESSON,
            )
        await mqtt.wait_for(lambda: len(mqtt.on(f"/assessment/{DEV}")) == 2, 60)
        await store.flush()
        found = await store.get_instance("i1")
        for task in tasks:
            task.cancel()

    by_step = {a["step_index"]: a for a in mqtt.on(f"/assessment/{DEV}")}
    assert by_step[0]["expected_text"] is None
    assert by_step[0]["metrics"] == []
    assert by_step[0]["asr_text"] == "good morning"  # heard, but nothing to compare with
    assert by_step[1]["metrics"] == [{"method": "text_similarity_v0", "value": 1.0}]
    assert found is not None
    steps = {st.step_index: st for st in found[1]}
    assert steps[0].asr_text == "good morning"
    assert steps[0].metrics == ()
    assert steps[0].assessed_at is not None
    assert [(m.method, m.value) for m in steps[1].metrics] == [("text_similarity_v0", 1.0)]
    assert [h[2] for h in heard] == [0, 1]  # ASR text goes back to the runtime (exit phrases)
