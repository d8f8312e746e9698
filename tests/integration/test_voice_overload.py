"""Voice overload and decode on demand on real components (Mosquitto, the board and Xiaozhi simulators, espeak-ng
speech over encrypted UDP, the archive on files, SQLite, pocketsphinx): when the gateway admits
no lesson window to decode, the lesson still steps on its timer, every spoken answer is archived
undecoded with its step stored ``assessment_shed = "voice_overload"`` (nothing published as an
assessment, no VAD events), and ``reassess`` then assesses those answers from the archive.

The governor's verdicts (lag probe → share) have their own unit tests; here the share is set
to 0 and frozen, as after a run of overloaded intervals, to test what follows from it.

Decode on demand: with an ASR that cannot keep up (one worker, one queued job, each answer
taking longer than the lesson), the windows opened while the queue is full are captured the
same way and stored ``assessment_shed = "asr_saturated"``; the others are decoded and heard."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from gateway.app import Gateway
from gateway.archive import FileBlobs
from gateway.assessment.procslot import ProcessBackend
from gateway.assessment.reassess import EngineIdentity, ReassessSelection, reassess
from gateway.assessment.sphinx import PocketsphinxEngine
from gateway.simulators.xiaozhi import XiaozhiDeviceSim
from gateway.store.assessments import assessments_of
from gateway.xiaozhi.overload import DecodeAdmissionConfig
from tests.integration.test_learning_record import decoded_ms
from tests.support.broker import Broker
from tests.support.mqtt_client import ClientSession
from tests.support.voice_lesson import (
    Observed,
    fetch_instance,
    lesson_rig,
    scripted_lesson,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

BUSY_S = 90.0  # far longer than the whole lesson: the first answer is still running at its end


class BusySphinx(PocketsphinxEngine):
    """pocketsphinx on an ASR host busy with others' answers: each answer waits BUSY_S first
    (a worker process like any other; its slot is killed when the gateway stops). Once loaded
    it says so to the test's socket ``$BUSY_SPHINX_READY`` (Linux abstract namespace), so the
    test starts the lesson with the worker idle."""

    def __init__(self) -> None:
        super().__init__()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(b"ready", "\0" + os.environ["BUSY_SPHINX_READY"])

    def transcribe(self, *args: Any, **kwargs: Any) -> Any:
        time.sleep(BUSY_S)
        return super().transcribe(*args, **kwargs)


async def overloaded_lesson(
    gw: Gateway,
    seen: Observed,
    device: XiaozhiDeviceSim,
    backend: ClientSession,
    device_id: str,
) -> str:
    """The script's lesson with the voice governor's share at 0 and frozen (as after a run of
    overloaded intervals): every window captured undecoded; returns once archived and stored."""
    admission = gw.xiaozhi.overload.admission
    admission.config = DecodeAdmissionConfig(interval_ms=1e12)  # no verdict moves it
    admission.share = 0.0  # every lesson window opens capture-only
    instance_id = await scripted_lesson(device, seen, backend, device_id)
    assert gw.archive is not None
    await gw.archive.drained()
    await gw.store.flush()
    return instance_id


async def test_windows_captured_under_overload_keep_time_archive_and_reassess(
    broker: Broker, tmp_path: Path, device_id: str
) -> None:
    async with lesson_rig(broker, tmp_path, device_id, PocketsphinxEngine) as (
        gw,
        seen,
        device,
        backend,
    ):
        instance_id = await overloaded_lesson(gw, seen, device, backend, device_id)
        assert gw.archive is not None

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


async def test_windows_the_asr_cannot_take_are_captured_archived_and_shed_asr_saturated(
    broker: Broker, tmp_path: Path, device_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"snlpgw-test-asr-{uuid.uuid4().hex}"
    ready = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    ready.bind("\0" + name)
    ready.setblocking(False)
    monkeypatch.setenv("BUSY_SPHINX_READY", name)  # the worker process inherits it
    with ready:  # closed at the end
        async with lesson_rig(
            broker, tmp_path, device_id, BusySphinx, asr={"queue_limit": 1, "job_timeout_s": 600}
        ) as (gw, seen, device, backend):
            async with asyncio.timeout(120):  # the worker loaded: step 0's answer runs at once
                await asyncio.get_running_loop().sock_recv(ready, 16)
            instance_id = await scripted_lesson(device, seen, backend, device_id)
            assert gw.archive is not None
            await gw.archive.drained()
            await gw.store.flush()

            assert len(seen.named("step.played")) == 4  # the lesson kept its timer
            # Step 0's answer runs (BUSY_S), step 1's waits in the one-place queue: from then on
            # no window can be assessed, so steps 2 and 3 are only captured, never decoded.
            heard = sorted({e["step_index"] for e in seen.named("speech.stopped")})
            assert heard == [0, 1], seen.named("speech.stopped")
            record = await fetch_instance(gw, instance_id)
            steps = {s["step_index"]: s for s in record["steps"]}
            assert [steps[i]["assessment_shed"] for i in range(4)] == [
                None, None, "asr_saturated", "asr_saturated"
            ], [(s["step_index"], s["assessment_shed"]) for s in steps.values()]  # fmt: skip
            for i in (2, 3):  # the whole window kept, decodable: reassess can assess it later
                audio_id = steps[i]["audio_id"]
                packets = await gw.archive.packets(audio_id)
                assert len(packets) >= 17
                assert decoded_ms(await gw.archive.get(audio_id), tmp_path) == 60.0 * len(packets)
            snap = gw.service.metrics.snapshot()
            assert snap['snlpgw_assessment_claims_total{outcome="kept"}'] == 2.0
            assert snap['snlpgw_assessment_claims_total{outcome="refused"}'] == 2.0
            assert snap['snlpgw_xiaozhi_lesson_windows_total{mode="unclaimed"}'] == 2.0
            assert snap['snlpgw_assessments_shed_total{reason="asr_saturated"}'] == 2.0
            assert seen.assessments == []  # nothing finished: the first answer is still running


async def test_answers_shed_under_overload_are_assessed_late_once_the_gateway_is_calm(
    broker: Broker, tmp_path: Path, device_id: str
) -> None:
    """Catch-up: the same captured lesson, with ``asr.catch_up_interval_s`` on. Nothing is taken
    up while the loop is overloaded; once it is calm and the ASR idle, every shed answer is
    assessed from its recording, published on the assessment topic and stored as the step's own
    assessment, its ``assessment_shed`` kept."""
    async with lesson_rig(
        broker, tmp_path, device_id, PocketsphinxEngine, asr={"catch_up_interval_s": 0.2}
    ) as (gw, seen, device, backend):
        instance_id = await overloaded_lesson(gw, seen, device, backend, device_id)
        snap = gw.service.metrics.snapshot()
        assert snap['snlpgw_assessments_shed_total{reason="voice_overload"}'] == 4.0
        assert not any(k.startswith("snlpgw_assessment_catch_up_total") for k in snap)
        assert seen.assessments == []  # overloaded: nothing taken up

        gw.xiaozhi.overload.admission.share = 1.0  # calm again
        await seen.until(lambda: len(seen.assessments) == 4, 180)
        by_step = {a["step_index"]: a for a in seen.assessments}
        assert sorted(by_step) == [0, 1, 2, 3]
        assert {a["instance_id"] for a in seen.assessments} == {instance_id}
        assert by_step[0]["metrics"][0]["value"] >= 0.8  # "Good morning." in the recording
        assert by_step[1]["metrics"][0]["value"] <= 0.5  # not "How are you?"
        assert by_step[2]["metrics"] == []  # the silent window: nothing heard
        assert by_step[3]["metrics"][0]["value"] >= 0.5  # "See you later" heard
        await gw.store.flush()
        record = await fetch_instance(gw, instance_id)
        steps = {s["step_index"]: s for s in record["steps"]}
        for i in range(4):  # the step's own assessment, written late; why it was late kept
            assert steps[i]["assessment_shed"] == "voice_overload"
            assert steps[i]["assessed_at"] == by_step[i]["assessed_at"]
            assert steps[i]["asr_text"] == by_step[i]["asr_text"]
        snap = gw.service.metrics.snapshot()
        assert snap['snlpgw_assessment_catch_up_total{outcome="assessed"}'] == 4.0
