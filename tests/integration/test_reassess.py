"""Re-assessment of archived answers: a lesson over real components (Mosquitto, board and Xiaozhi
simulators, espeak-ng speech over encrypted UDP, the archive on files, SQLite) whose live engine
raised on the last step; then ``reassess`` with the real pocketsphinx, in-process and as the
``snlpgw reassess`` command: new (engine, version) rows beside the originals, idempotent."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.app import Gateway
from gateway.archive import FileBlobs
from gateway.assessment.procslot import ProcessBackend
from gateway.assessment.reassess import (
    EngineIdentity,
    ReassessReport,
    ReassessSelection,
    reassess,
)
from gateway.assessment.sphinx import PocketsphinxEngine
from gateway.store.assessments import StepAssessment, assessments_of
from tests.support.asr_engines import RaisingEngine
from tests.support.broker import Broker
from tests.support.voice_lesson import fetch_instance, lesson_rig, scripted_lesson

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]
ROOT = Path(__file__).resolve().parents[2]
SIM = "text_similarity_v0"


async def _history(gw: Gateway, device: str) -> tuple[int, dict[str, Any]]:
    url = f"http://127.0.0.1:{gw.service.admin.port}/results/devices/{device}/history"
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        return resp.status, await resp.json()


def _cli(tmp_path: Path, *args: str) -> tuple[int, dict[str, int], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNLPGW_")}
    env.update(
        SNLPGW_DATA_DIR=str(tmp_path / "cli-data"),
        SNLPGW_STORE__SQLITE_PATH=str(tmp_path / "gateway.sqlite3"),
        SNLPGW_ARCHIVE__DIR=str(tmp_path / "audio"),
    )
    done = subprocess.run(  # our own CLI
        [sys.executable, "-m", "gateway", "reassess", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    summary = json.loads(done.stdout) if done.stdout.strip() else {}
    return done.returncode, summary, done.stderr


async def test_reassess_archived_answers_beside_the_originals_idempotently(
    broker: Broker, tmp_path: Path, device_id: str
) -> None:
    async with lesson_rig(broker, tmp_path, device_id, RaisingEngine) as (
        gw,
        seen,
        device,
        backend,
    ):
        instance_id = await scripted_lesson(device, seen, backend, device_id)
        await seen.until(lambda: len(seen.assessments) >= 3, 30)
        assert gw.archive is not None
        await gw.archive.drained()
        await gw.store.flush()
        before = await fetch_instance(gw, instance_id)
        original = {s["step_index"]: s for s in before["steps"]}
        assert original[3]["metrics"] == []  # the live engine raised on it
        assert original[3]["audio_id"]

        async def run() -> tuple[ReassessReport, list[StepAssessment]]:
            report = await reassess(
                store=gw.store,
                blobs=FileBlobs(tmp_path / "audio"),
                backend=ProcessBackend(PocketsphinxEngine, name="pocketsphinx"),
                identity=EngineIdentity("pocketsphinx", "test-1"),
                selection=ReassessSelection(instance_id=instance_id),
            )
            rows = await gw.store.call(lambda db: assessments_of(db, [instance_id]))
            return report, list(rows)

        first, rows = await run()
        assert (first.selected, first.assessed, first.already, first.failed) == (3, 3, 0, 0)
        by_step = {r.step_index: r for r in rows}
        assert sorted(by_step) == [0, 1, 3]  # the spoken (archived) steps
        assert by_step[0].metrics[0].value >= 0.8
        assert by_step[1].metrics[0].value <= 0.5
        assert by_step[3].metrics[0].method == SIM
        assert by_step[3].metrics[0].value >= 0.8
        assert by_step[3].audio_id == original[3]["audio_id"]

        again, rows_again = await run()
        assert (again.assessed, again.already, again.failed) == (0, 3, 0)
        assert rows_again == rows  # nothing rewritten

        after = await fetch_instance(gw, instance_id)
        assert after["steps"] == before["steps"]  # the original assessment stays as it was

        # The command, with the settings' engine: a second (engine, version) row per step.
        code, summary, err = await asyncio.to_thread(_cli, tmp_path, "--device", device_id)
        assert code == 0, err[-2000:]
        assert summary == {
            "selected": 3, "assessed": 3, "already": 0, "missing_audio": 0, "failed": 0,
        }  # fmt: skip
        code, summary, err = await asyncio.to_thread(_cli, tmp_path, "--instance", instance_id)
        assert (code, summary["assessed"], summary["already"]) == (0, 0, 3), err[-2000:]
        rows = await gw.store.call(lambda db: assessments_of(db, [instance_id]))
        assert len(rows) == 6
        assert {r.engine_version for r in rows} - {"test-1"}  # the installed engine's version
        assert "good morning" not in err.lower()  # no transcripts in the logs
        status, history = await _history(gw, device_id)
        assert status == 200
        (run_,) = history["instances"]
        shown = {s["step_index"]: s["reassessments"] for s in run_["steps"]}
        assert len(shown[3]) == 2  # both engine versions, beside the original (none)
        assert all(r["metrics"][0]["value"] >= 0.8 for r in shown[3])
        assert shown[2] == []
        code, _, err = await asyncio.to_thread(_cli, tmp_path)
        assert code == 2
        assert "--instance" in err

        # Forgetting the device erases its re-assessments with the rest of its record.
        await gw.archive.forget(device_id)
        assert await gw.store.call(lambda db: assessments_of(db, [instance_id])) == []
