"""Voice overload on real components (Mosquitto, the board and Xiaozhi simulators, espeak-ng
speech over encrypted UDP, the archive on files, SQLite, pocketsphinx): when the gateway admits
no lesson window to decode, the lesson still steps on its timer, every spoken answer is archived
undecoded with its step stored ``assessment_shed = "voice_overload"`` (nothing published as an
assessment, no VAD events), and ``reassess`` then assesses those answers from the archive.

The governor's verdicts (lag probe → share) have their own unit tests; here the share is set
to 0 and frozen, as after a run of overloaded intervals, to test what follows from it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.archive import FileBlobs
from gateway.assessment.procslot import ProcessBackend
from gateway.assessment.reassess import EngineIdentity, ReassessSelection, reassess
from gateway.assessment.sphinx import PocketsphinxEngine
from gateway.store.assessments import assessments_of
from gateway.xiaozhi.overload import DecodeAdmissionConfig
from tests.integration.test_learning_record import decoded_ms
from tests.support.broker import Broker
from tests.support.voice_lesson import SCRIPT, child, fetch_instance, lesson_rig, start

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


async def test_windows_captured_under_overload_keep_time_archive_and_reassess(
    broker: Broker, tmp_path: Path, device_id: str
) -> None:
    async with lesson_rig(broker, tmp_path, device_id, PocketsphinxEngine) as (
        gw,
        seen,
        device,
        backend,
    ):
        admission = gw.xiaozhi.overload.admission
        admission.config = DecodeAdmissionConfig(interval_ms=1e12)  # no verdict moves it
        admission.share = 0.0  # every lesson window opens capture-only
        async with asyncio.TaskGroup() as tg:
            reader = tg.create_task(child(device, seen, SCRIPT), name="test.child")
            instance_id = await start(backend, device_id, seen)
            await seen.until(lambda: bool(seen.named("instance.completed")), 60)
            await reader
        assert gw.archive is not None
        await gw.archive.drained()
        await gw.store.flush()

        # On the timer: all four clips played and each window closed.
        assert len(seen.named("step.played")) == 4
        assert len(seen.named("window.closed")) == 4
        # Nothing was decoded: no VAD events, no assessment published.
        assert seen.named("speech.started") == seen.named("speech.stopped") == []
        assert seen.assessments == []
        record = await fetch_instance(gw, instance_id)
        steps = {s["step_index"]: s for s in record["steps"]}
        # Every window's audio (silence included: undecoded, nobody knows it is silent) kept.
        assert all(steps[i]["audio_id"] for i in range(4))
        assert [steps[i]["assessment_shed"] for i in range(4)] == ["voice_overload"] * 4, [
            (s["step_index"], s["assessment_shed"], s["audio_id"]) for s in steps.values()
        ]
        assert all(steps[i]["asr_text"] is None for i in range(4))
        for i in range(4):  # the device's own packets, decodable whole (>= 1 s each)
            audio_id = steps[i]["audio_id"]
            packets = await gw.archive.packets(audio_id)
            assert len(packets) >= 17
            assert decoded_ms(await gw.archive.get(audio_id), tmp_path) == 60.0 * len(packets)
        snap = gw.service.metrics.snapshot()
        assert snap['snlpgw_xiaozhi_lesson_windows_total{mode="captured"}'] == 4.0
        assert snap['snlpgw_assessments_shed_total{reason="voice_overload"}'] == 4.0
        assert snap["snlpgw_xiaozhi_opus_frames_decoded_total"] == 0.0

        # Later, with time to spare: reassess assesses the captured answers from the archive.
        report = await reassess(
            store=gw.store,
            blobs=FileBlobs(tmp_path / "audio"),
            backend=ProcessBackend(PocketsphinxEngine, name="pocketsphinx"),
            identity=EngineIdentity("pocketsphinx", "test-1"),
            selection=ReassessSelection(instance_id=instance_id),
        )
        assert (report.selected, report.assessed, report.failed) == (4, 4, 0)
        rows = await gw.store.call(lambda db: assessments_of(db, [instance_id]))
        by_step = {r.step_index: r.metrics[0].value for r in rows if r.metrics}
        assert sorted(by_step) == [0, 1, 3], rows  # the silent window: nothing heard, no numbers
        assert by_step[0] >= 0.8  # "Good morning." heard in the whole window's audio
        assert by_step[1] <= 0.5  # "I like green apples." is not "How are you?"
