"""A lesson on a device WITHOUT an SD card (no snlp/v1 board at all): Mosquitto, the gateway and
only the Xiaozhi device simulator, which both hears the lesson's clips (Opus over encrypted UDP)
and reads a script into the listen windows. The clips are real MP3 files (espeak-ng → sox) in a
resource directory of the test's own, laid out as the boards' SD cards are (SPEC §5).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from devstack.gateway import gateway_settings, serving
from gateway.app import Gateway, build_gateway
from gateway.assessment.procslot import ProcessBackend
from gateway.simulators.xiaozhi import XiaozhiDeviceSim, encode_pcm
from tests.support.broker import Broker
from tests.support.mqtt_client import ClientSession, mqtt_client
from tests.support.speech import silence
from tests.support.voice_lesson import CATALOG, Observed, watch
from topics import mac_colon

LESSON_DIR = Path("english_learning/shadowing/lessons/unit01")
FRAME_MS = 60
PAD_S = 1.5


def espeak_mp3(text: str, path: Path) -> None:
    """``text`` read by espeak-ng, then ``PAD_S`` of silence (a lesson clip's pause, which
    also sizes the listen window for a child who answers at a natural pace), as MP3 (sox)."""
    wav = path.with_suffix(".wav")
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(wav), text], check=True)
    subprocess.run(["sox", str(wav), str(path), "pad", "0", str(PAD_S)], check=True)
    wav.unlink()


def sox_pcm(path: Path) -> bytes:
    """The clip as 16 kHz mono s16le, decoded by sox directly (what the device should get)."""
    argv = ["sox", str(path), "-r", "16000", "-c", "1", "-b", "16", "-e", "signed", "-t", "raw"]
    return subprocess.run([*argv, "-"], check=True, capture_output=True).stdout


def make_resources(root: Path, clips: dict[str, str]) -> Path:
    """The unit01 shadowing clips (name → the text read into it) under ``root``."""
    lesson = root / LESSON_DIR
    lesson.mkdir(parents=True)
    for name, text in clips.items():
        espeak_mp3(text, lesson / name)
    shutil.copy(CATALOG / "resources" / LESSON_DIR / "04.txt", lesson / "04.txt")
    return root


@contextlib.asynccontextmanager
async def sdless_rig(
    broker: Broker, tmp_path: Path, device_id: str, engine: type, resource_dir: Path
) -> AsyncIterator[tuple[Gateway, Observed, XiaozhiDeviceSim, ClientSession]]:
    settings = gateway_settings(
        broker,
        broker.data_dir,
        runtime={"catalog_path": CATALOG, "resource_dir": resource_dir},
        asr={"workers": 1},
        store={"sqlite_path": tmp_path / "gateway.sqlite3"},
        archive={"dir": tmp_path / "audio"},
    )
    gw = build_gateway(settings, asr_backend=ProcessBackend(engine, name=engine.__name__.lower()))
    backend_user = broker.provision(f"be-{device_id[-5:].replace('_', '')}", role="backend")
    seen = Observed()
    async with serving(gw.service) as svc:
        device = XiaozhiDeviceSim(mac=mac_colon(device_id))
        await device.provision(f"http://127.0.0.1:{svc.http.port}/xiaozhi/ota/")
        async with (
            mqtt_client(broker, backend_user) as backend,
            device,
            asyncio.TaskGroup() as tg,
        ):
            for kind in ("task", "assessment", "reply"):
                await backend.subscribe(f"snlpgw/v1/{kind}/{device_id}")
            watcher = tg.create_task(watch(backend, device_id, seen), name="test.watch")
            await device.open_audio_channel()
            await device.stream_opus(encode_pcm(silence(FRAME_MS)))  # its UDP address known
            try:
                yield gw, seen, device, backend
            finally:
                watcher.cancel()


async def clip_frame_counts(device: XiaozhiDeviceSim, clips: int) -> list[int]:
    """How many Opus frames the device held at each clip's ``tts stop`` (the next clip starts
    only after a listen window, so each count closes one clip)."""
    counts, after = [], 0
    for _ in range(clips):
        stop = await device.expect("tts", state="stop", after=after, timeout_s=60)
        after = next(i for i, m in enumerate(device.inbox) if m is stop) + 1
        counts.append(len(device.downlink_audio))
    return counts


def stop_request() -> dict[str, Any]:
    return {"v": 1, "id": "r2", "action": "stop"}
