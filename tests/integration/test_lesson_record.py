"""The learning record end to end: a shadowing lesson over Mosquitto, the board simulator and a
Xiaozhi device streaming espeak-ng speech over encrypted UDP. Each spoken step's answer is
archived as the device's own Opus packets (Ogg Opus); opusdec decodes it to the utterance's
duration (whole 60 ms frames); it is served on a signed link only; no transcript reaches the
logs; ``snlpgw device forget`` leaves nothing of the device in the store or the archive.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import sys
from pathlib import Path

import aiohttp
import pytest

from gateway.archive import demux_ogg_opus
from tests.integration.test_learning_record import decoded_ms
from tests.support.asr_engines import RaisingEngine
from tests.support.broker import Broker
from tests.support.voice_lesson import fetch_instance, lesson_rig, scripted_lesson

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parents[2]
FRAME_MS = 60


async def test_a_lesson_keeps_each_answer_privately(
    broker: Broker, tmp_path: Path, device_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
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

        stored = await fetch_instance(gw, instance_id)
        steps = {s["step_index"]: s for s in stored["steps"]}
        archived = {i: s["audio_id"] for i, s in steps.items() if s["audio_id"]}
        assert sorted(archived) == [0, 1, 3]  # the spoken steps; silence keeps nothing
        heard: dict[int, list[int]] = {}
        for event in seen.named("speech.stopped"):
            heard.setdefault(event["step_index"], []).append(event["data"]["duration_ms"])
        for step, audio_id in archived.items():
            path = tmp_path / "audio" / audio_id[:2] / f"{audio_id}.opus"
            data = path.read_bytes()
            # An independent decoder reads the device's packets, unchanged, to their duration:
            # the utterance's own length, rounded out to the 60 ms frames that carry it.
            length = decoded_ms(data, tmp_path)
            assert length == FRAME_MS * len(demux_ogg_opus(data).packets)
            assert any(d <= length < d + 2 * FRAME_MS for d in heard[step]), (length, heard)

        # Served only on a signed link (the admin listener), never without a valid one.
        admin = f"http://127.0.0.1:{gw.service.admin.port}"
        async with aiohttp.ClientSession() as http:
            ask = {"instance_id": instance_id, "step_index": 0}
            async with http.post(f"{admin}/admin/audio/links", json=ask) as resp:
                assert resp.status == 200
                link = await resp.json()
            assert link["audio_id"] == archived[0]
            async with http.get(admin + link["url"]) as resp:
                assert resp.status == 200
                assert resp.content_type == "audio/ogg"
                assert (
                    await resp.read()
                    == path.parent.parent.joinpath(
                        archived[0][:2], f"{archived[0]}.opus"
                    ).read_bytes()
                )
            forged = link["url"].replace("sig=", "sig=0")
            bare = f"/admin/audio/{archived[0]}"
            for url in (forged, bare):
                async with http.get(admin + url) as resp:
                    assert resp.status == 403
            missing = {"instance_id": instance_id, "step_index": 2}
            async with http.post(f"{admin}/admin/audio/links", json=missing) as resp:
                assert resp.status == 404

        # No transcript (nor the texts the child read) in anything the gateway logged.
        said = {str(s[k]).lower() for s in steps.values() for k in ("asr_text", "expected_text")}
        said.discard("none")
        logged = "\n".join(r.getMessage() for r in caplog.records).lower()
        assert said
        assert "archive on" in logged  # the gateway's records are captured here
        assert not [text for text in said if text in logged]
        assert "oggs" not in logged

        # `snlpgw device forget`: the record goes (store rows, transcripts, metrics, audio).
        env = {k: v for k, v in os.environ.items() if not k.startswith("SNLPGW_")}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "device", "--admin-url", admin, "forget", device_id,
            cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        async with asyncio.timeout(120):
            out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        answer = json.loads(out)
        assert answer["forgotten"] is True  # unbound too
        assert answer["record"]["steps"] == 4
        assert answer["record"]["blobs"] == 3
        db = sqlite3.connect(tmp_path / "gateway.sqlite3")
        try:
            for sql in (
                "SELECT COUNT(*) FROM instances WHERE device = ?",
                "SELECT COUNT(*) FROM audio WHERE device = ?",
            ):
                assert db.execute(sql, (device_id,)).fetchone()[0] == 0
            assert (
                db.execute(
                    "SELECT COUNT(*) FROM steps WHERE instance_id = ?", (instance_id,)
                ).fetchone()[0]
                == 0
            )
        finally:
            db.close()
        assert list((tmp_path / "audio").glob("*/*.opus")) == []
