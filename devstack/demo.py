"""`make demo`: a shadowing lesson end to end on this machine, then a lesson exited mid-way
and a spoken CHAT turn (:mod:`devstack.demo_chat`), printed as a timeline.

A local Mosquitto (project config, free port), the composed gateway in-process (ephemeral ports),
a board simulator and a Xiaozhi device simulator for the same device id. The teacher's clips and
the child's readings are spoken by espeak-ng at run time. A provisioned backend user starts the
lesson on the control topic; on each ``window.opened`` the device streams the child's reading in
real time (step 1 right, step 2 wrong, step 3 silent, step 4 right). Exit 0 on success.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import secrets
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import aiomqtt

from devstack import audio
from devstack.broker import Broker, StackError, local_broker, wait_connectable
from devstack.demo_chat import exit_then_chat
from devstack.demo_report import DemoTimeline, instance_table
from devstack.gateway import Use, gateway_settings, running_gateway
from gateway.app import Gateway
from gateway.chat import espeak
from gateway.simulators.board import BoardSimulator, SimOptions
from gateway.simulators.xiaozhi import FRAME_MS, XiaozhiDeviceSim, encode_pcm

APP, TASK, LESSON = "english_learning", "shadowing", "unit01"
CLIP_DIR = f"{APP}/{TASK}/lessons/{LESSON}"
ASSESSMENT_WAIT_S = 20.0
LESSON_TIMEOUT_S = 60.0
REACTION_MS = 200  # the child starts reading this long after the window opens


@dataclass(frozen=True)
class DemoStep:
    clip: str
    teacher: str
    child: str | None  # None: the child stays silent


STEPS = (
    DemoStep("01.mp3", "Good morning.", "Good morning."),
    DemoStep("02.mp3", "How are you?", "I like apples."),
    DemoStep("03.mp3", "I am fine, thank you.", None),
    DemoStep("04.mp3", "See you later, alligator.", "See you later, alligator."),
)


class DemoError(RuntimeError):
    pass


@dataclass
class DemoResult:
    instance_id: str = ""
    completed: bool = False
    assessments: dict[int, dict[str, Any]] = field(default_factory=dict)
    stored: dict[str, Any] = field(default_factory=dict)
    chat_reply: str = ""  # what the device said in the CHAT turn after the exit
    lines: list[str] = field(default_factory=list)


class Uplink:
    """The device's microphone: one 60 ms Opus frame per tick, silence unless speech is queued."""

    def __init__(self, device: XiaozhiDeviceSim) -> None:
        self._device = device
        self._silence = encode_pcm(espeak.silence(FRAME_MS))[0]
        # Bounded: a few readings at most; overflow drops the oldest frames (audio policy).
        self._frames: collections.deque[bytes] = collections.deque(maxlen=2_000)

    def say(self, pcm: bytes) -> None:
        self._frames.extend(encode_pcm(espeak.silence(REACTION_MS) + pcm))

    async def run(self) -> None:
        crypto = self._device.crypto
        if crypto is None:
            raise DemoError("audio channel not open")
        loop = asyncio.get_running_loop()
        start, tick = loop.time(), 0
        while True:
            packet = self._frames.popleft() if self._frames else self._silence
            self._device.send_datagram(crypto.seal(packet))
            tick += 1
            await asyncio.sleep(max(0.0, start + tick * FRAME_MS / 1000 - loop.time()))


def _new_mac() -> str:
    octets = bytearray(secrets.token_bytes(6))
    octets[0] = (octets[0] | 0x02) & 0xFE  # locally administered, unicast
    return ":".join(f"{b:02x}" for b in octets)


def _prepare_audio(media_dir: Path) -> dict[int, bytes]:
    """Write the teacher's clips where the board reads durations; return the child's readings."""
    espeak.require_tools()
    child: dict[int, bytes] = {}
    for index, step in enumerate(STEPS):
        audio.write_wav(media_dir / CLIP_DIR / step.clip, audio.teacher_clip(step.teacher))
        if step.child is not None:
            child[index] = espeak.synthesize(step.child, wpm=160)
    return child


async def _fetch_instance(gw: Gateway, instance_id: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{gw.service.admin.port}/task/instance/{instance_id}"
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        if resp.status != 200:
            raise DemoError(f"GET {url} answered {resp.status}: {await resp.text()}")
        body: dict[str, Any] = await resp.json()
        return body


async def _lesson(
    broker: Broker, gw: Gateway, media_dir: Path, child: dict[int, bytes], tl: DemoTimeline
) -> DemoResult:
    result = DemoResult()
    ota_url = f"http://127.0.0.1:{gw.service.http.port}/xiaozhi/ota/"
    device = XiaozhiDeviceSim(mac=_new_mac(), board="sening-demo")
    info = await device.provision(ota_url)  # the gateway creates the device's broker user
    dev = info.username
    await wait_connectable(broker, dev, info.password)
    backend = broker.provision("demo-backend", role="backend")
    await wait_connectable(broker, backend.username, backend.password)
    board = BoardSimulator(
        dev,
        host=broker.host,
        port=broker.port,
        username=dev,
        password=info.password,
        options=SimOptions(media_dir=media_dir),
    )
    said = {i: s.child for i, s in enumerate(STEPS)}
    async with (
        aiomqtt.Client(
            broker.host,
            broker.port,
            username=backend.username,
            password=backend.password,
            identifier=f"demo-backend-{secrets.token_hex(4)}",
        ) as client,
        device,
        asyncio.TaskGroup() as tg,
    ):
        for kind in ("task", "assessment", "reply"):
            await client.subscribe(f"snlpgw/v1/{kind}/{dev}", qos=1)
        board_task = tg.create_task(board.run(), name=f"demo.board[{dev}]")
        await board.connected.wait()
        await device.open_audio_channel()
        uplink = Uplink(device)
        uplink_task = tg.create_task(uplink.run(), name=f"demo.uplink[{dev}]")
        tl.note(f"device {dev}: board online, Xiaozhi audio channel open")
        request = {"v": 1, "id": "demo-start", "action": "start", "app_id": APP}
        request |= {"task_id": TASK, "lesson_id": LESSON, "priority": 3, "source": "demo"}
        await client.publish(f"snlpgw/v1/ctl/{dev}", json.dumps(request), qos=1)
        tl.note(f"backend: start {APP}/{TASK}/{LESSON}")
        try:
            async with asyncio.timeout(LESSON_TIMEOUT_S) as deadline:
                await _follow(
                    client=client,
                    tl=tl,
                    result=result,
                    said=said,
                    child=child,
                    uplink=uplink,
                    deadline=deadline,
                )
            result.chat_reply = await exit_then_chat(
                client=client, device=device, uplink=uplink, tl=tl, dev=dev, start=request,
                fail=DemoError,
            )  # fmt: skip
        except TimeoutError:
            raise DemoError(
                f"timed out: completed={result.completed}, "
                f"assessments for steps {sorted(result.assessments)} of {sorted(child)}"
            ) from None
        finally:
            uplink_task.cancel()
            board_task.cancel()
    result.stored = await _fetch_instance(gw, result.instance_id)
    return result


async def _follow(
    *,
    client: aiomqtt.Client,
    tl: DemoTimeline,
    result: DemoResult,
    said: dict[int, str | None],
    child: dict[int, bytes],
    uplink: Uplink,
    deadline: asyncio.Timeout,
) -> None:
    """Print what the backend sees until the lesson completed and every assessment arrived."""
    async for message in client.messages:
        body = json.loads(message.payload if isinstance(message.payload, bytes) else b"{}")
        kind = message.topic.value.split("/")[2]
        if kind == "reply":
            if body.get("status") != "accepted":
                raise DemoError(f"start refused: {body}")
            result.instance_id = str(body.get("instance_id"))
        elif kind == "assessment":
            result.assessments[int(body["step_index"])] = body
            tl.assessment(body)
        else:
            tl.task_event(body, said)
            step = body.get("step_index")
            if body.get("event") == "window.opened" and isinstance(step, int) and step in child:
                uplink.say(child[step])
            elif body.get("event") == "instance.cancelled":
                raise DemoError(f"lesson cancelled: {body.get('data')}")
            elif body.get("event") == "instance.completed":
                result.completed = True
                result.instance_id = result.instance_id or str(body.get("instance_id"))
                # Assessments are a side path: bounded wait for those still on their way.
                deadline.reschedule(asyncio.get_running_loop().time() + ASSESSMENT_WAIT_S)
        if result.completed and len(result.assessments) >= len(child):
            return


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _check(result: DemoResult) -> None:
    steps = result.stored.get("steps") or []
    if len(steps) != len(STEPS):
        raise DemoError(f"expected {len(STEPS)} stored steps, found {len(steps)}")
    if result.stored.get("instance", {}).get("state") != "completed":
        raise DemoError(f"instance not completed: {result.stored.get('instance')}")


async def run_demo(
    *, data_dir: Path | None = None, write: Callable[[str], None] = _say
) -> DemoResult:
    """Run the whole demo; raises :class:`DemoError` (or the stack's error) on failure."""
    with tempfile.TemporaryDirectory(prefix="snlpgw-demo-") as tmp:
        root = data_dir or Path(tmp)
        tl = DemoTimeline(write)
        tl.note("synthesizing the lesson audio with espeak-ng")
        child = _prepare_audio(root / "media")
        async with local_broker(root / "data") as broker:
            tl.note(f"mosquitto ready on {broker.url}")
            settings = gateway_settings(broker, gateway_id="demo-gw", use=Use.DEMO)
            async with running_gateway(settings) as gw:
                tl.note(
                    f"gateway ready: HTTP :{gw.service.http.port}, admin :{gw.service.admin.port}, "
                    f"UDP :{gw.xiaozhi.udp_port}"
                )
                result = await _lesson(broker, gw, root / "media", child, tl)
        write("")
        for line in instance_table(result.stored):
            write(line)
        result.lines = tl.lines
        _check(result)
        return result


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(run_demo())
    except (DemoError, StackError, espeak.SpeechToolsMissingError, OSError) as exc:
        sys.stderr.write(f"demo failed: {exc}\n")
        return 1
    _say(
        "\ndemo finished: lesson completed, assessments received, exit back to CHAT, "
        "a spoken chat turn answered, everything stopped"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
