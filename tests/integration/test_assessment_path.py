"""The assessment side path with the real ASR pool (pocketsphinx worker) and a real store."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.assessment.path import AssessmentPath
from gateway.assessment.procslot import ProcessBackend
from gateway.assessment.sphinx import PocketsphinxEngine
from gateway.http import HttpServer
from gateway.metrics import Metrics
from gateway.service import Context, Ops
from gateway.settings import AsrSettings, load_settings
from gateway.store import InstanceRecord, InstanceState, Store
from tests.support.asr_engines import SecondEngine
from tests.support.fake_mqtt import FakePublisher
from tests.support.speech import synthesize

DEV = "aa_bb_cc_dd_ee_03"
LESSON = ("Good morning.", "How are you?", "I am fine, thank you.")


def _side_path(
    tmp_path: Path,
    engine: type = PocketsphinxEngine,
    queue_limit: int = 32,
    heard: list[tuple[str, str, int, str]] | None = None,
) -> tuple[AssessmentPath, Store, FakePublisher, Metrics]:
    """``heard`` collects what the path tells the task runtime (``on_text``)."""
    metrics, mqtt = Metrics(), FakePublisher()
    http = HttpServer(host="127.0.0.1", port=0, metrics=metrics)
    ctx = Context(load_settings(), mqtt, http, metrics, Ops("gw", mqtt, metrics), http)  # type: ignore[arg-type]
    store = Store(path=tmp_path / "gw.sqlite3", metrics=metrics, alarm=ctx.ops.alarm)
    sink = heard if heard is not None else []
    path = AssessmentPath(
        ctx=ctx,
        settings=AsrSettings(workers=1, queue_limit=queue_limit),
        store=store,
        on_text=lambda *args: sink.append(args),
        backend=ProcessBackend(engine, name=engine.__name__.lower()),
    )
    return path, store, mqtt, metrics


def _submit(path: AssessmentPath, step: int, utterance: str, text: str) -> None:
    path.submit_utterance(
        device=DEV,
        instance_id="i1",
        step_index=step,
        utterance_id=utterance,
        pcm=synthesize(text),
        prompt_text=f"/english_learning/shadowing/lessons/unit01/0{step + 1}.mp3",
        expected_text=LESSON[step],
        methods=("text_similarity_v0",),
        hints=LESSON,
    )


async def test_no_expected_text_gives_null_and_no_metrics(tmp_path: Path) -> None:
    heard: list[tuple[str, str, int, str]] = []
    path, store, mqtt, _ = _side_path(tmp_path, heard=heard)
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
        await mqtt.wait_for(lambda: len(mqtt.bodies(f"/assessment/{DEV}")) == 2, 60)
        await store.flush()
        found = await store.get_instance("i1")
        for task in tasks:
            task.cancel()

    by_step = {a["step_index"]: a for a in mqtt.bodies(f"/assessment/{DEV}")}
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


async def test_asr_queue_overflow_drops_the_oldest_and_raises_an_alarm(tmp_path: Path) -> None:
    path, store, mqtt, metrics = _side_path(tmp_path, SecondEngine, queue_limit=1)
    async with asyncio.TaskGroup() as tg:
        tasks = [
            tg.create_task(store.run(), name="t.store"),
            tg.create_task(path.run(), name="t.asr"),
        ]
        _submit(path, 0, "u0", "Good morning.")
        await mqtt.wait_for(lambda: metrics.snapshot().get("snlpgw_asr_queue_depth") == 0.0, 30)
        _submit(path, 1, "u1", "How are you?")  # queued
        _submit(path, 2, "u2", "I am fine, thank you.")  # queue full: step 1's job is dropped
        await mqtt.wait_for(lambda: len(mqtt.bodies(f"/assessment/{DEV}")) == 2, 60)
        for task in tasks:
            task.cancel()
    assert sorted(a["step_index"] for a in mqtt.bodies(f"/assessment/{DEV}")) == [0, 2]
    (alarm,) = mqtt.bodies("/events")
    assert alarm["alarm"] == "asr_dropped"
    assert alarm["device"] == DEV
    assert alarm["detail"] == {"suppressed": 0, "instance_id": "i1", "step_index": 1}


async def test_a_saturated_queue_sheds_the_oldest_and_stores_every_shed_step(
    tmp_path: Path,
) -> None:
    """Eight answers into a queue of two behind one busy worker: every step ends either
    assessed or stored as shed with its reason, counted; none is lost without a trace."""
    path, store, mqtt, metrics = _side_path(tmp_path, SecondEngine, queue_limit=2)
    sentences = [LESSON[n % 3] for n in range(8)]
    async with asyncio.TaskGroup() as tg:
        tasks = [
            tg.create_task(store.run(), name="t.store"),
            tg.create_task(path.run(), name="t.asr"),
        ]
        store.submit_instance(InstanceRecord("i1", device_id=DEV, state=InstanceState.RUNNING))
        _submit(path, 0, "u0", sentences[0])
        await mqtt.wait_for(lambda: metrics.snapshot().get("snlpgw_asr_queue_depth") == 0.0, 30)
        for step in range(1, 8):  # step 0 is running (1 s per job): these all queue at once
            path.submit_utterance(
                device=DEV,
                instance_id="i1",
                step_index=step,
                utterance_id=f"u{step}",
                pcm=synthesize(sentences[step]),
                prompt_text=None,
                expected_text=sentences[step],
                methods=("text_similarity_v0",),
                hints=LESSON,
            )
        await mqtt.wait_for(lambda: len(mqtt.bodies(f"/assessment/{DEV}")) == 3, 60)
        await store.flush()
        found = await store.get_instance("i1")
        for task in tasks:
            task.cancel()
    assessed = sorted(a["step_index"] for a in mqtt.bodies(f"/assessment/{DEV}"))
    assert assessed == [0, 6, 7]  # the running one and the two newest
    assert found is not None
    steps = {s.step_index: s for s in found[1]}
    shed = sorted(i for i, s in steps.items() if s.assessment_shed == "queue_full")
    assert shed == [1, 2, 3, 4, 5]
    assert all(steps[i].asr_text is None and steps[i].metrics == () for i in shed)
    assert all(steps[i].assessment_shed is None and steps[i].metrics for i in assessed)
    snapshot = metrics.snapshot()
    assert snapshot['snlpgw_assessments_shed_total{reason="queue_full"}'] == 5
    # one alarm for the burst (rate-limited); every shed step is counted and stored above
    (alarm,) = [a for a in mqtt.bodies("/events") if a["alarm"] == "asr_dropped"]
    assert alarm["detail"]["step_index"] == 1
