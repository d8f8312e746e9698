"""The inline budget bench's device worker process: a share of the N devices, each a board
simulator (MQTT, heartbeats) plus a Xiaozhi device simulator (MQTT + AES-CTR UDP), and one
backend client that starts their tasks and sees their task events.

``python -m bench.inline_devices SPEC.json`` (started by :mod:`bench.inline_budget`). It
synthesizes the answers ("it is N" + ``tail_ms`` of silence, each encoded once), brings every
device online, prints ``{"ready": n}``, waits for ``go T0`` on stdin, then starts each device's
task at ``T0 + offset`` and answers every question ``reaction_s`` after the question was said
(its ``tts stop``: the window opens then), in real time (one 60 ms packet per 60 ms). It prints
one JSON document (every round's wall-clock stamps, ``time.time()``: the machine's one clock,
which the parent compares with the gateway's stamps) and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.load.procs import die_with_parent, hold_gc
from gateway.simulators.board import BoardSimulator, SimOptions
from gateway.simulators.xiaozhi import MqttInfo, XiaozhiDeviceSim, encode_pcm
from tests.support.mqtt_client import ClientSession, mqtt_client
from tests.support.speech import silence, synthesize

TASK = "arithmetic_10"
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
CONNECT_AT_ONCE = 16
ROUND_WAIT_S = 60.0


def answer_packets(tail_ms: int) -> list[list[bytes]]:
    """Each answer 0..10 synthesized once and encoded once (speech + tail)."""
    return [encode_pcm(synthesize(f"it is {w}") + silence(tail_ms)) for w in WORDS]


@dataclass
class AnsweredRound:
    step: int
    answer_start: float = 0.0  # epoch s: first answer packet sent
    last_packet: float = 0.0  # epoch s: last answer packet sent
    first_frame: float | None = None  # epoch s: first feedback frame at the device
    feedback: str | None = None  # the feedback's sentence_start text
    close_ms: float | None = None  # the gateway's window.closed actual_close_ms
    signals_ms: float | None = None  # the gateway's step.signals ts: the transcript was back
    question_said: float = 0.0  # epoch s: the question's tts stop at the device
    answer_ms: float = 0.0  # the answer's audio (speech + tail): its real-time send duration


class BenchDevice(XiaozhiDeviceSim):
    """The simulator, noting the first feedback frame and text after each answer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.current: AnsweredRound | None = None

    def _on_json(self, payload: bytes) -> None:
        super()._on_json(payload)
        r = self.current
        if r is not None and r.answer_start and r.feedback is None and self.inbox:
            msg = self.inbox[-1]
            if msg.get("type") == "tts" and msg.get("state") == "sentence_start":
                r.feedback = str(msg.get("text"))

    def _on_datagram(self, datagram: bytes) -> None:
        before = len(self.downlink_audio)
        super()._on_datagram(datagram)
        r = self.current
        if (
            r is not None
            and r.answer_start
            and r.first_frame is None
            and len(self.downlink_audio) > before
        ):
            r.first_frame = time.time()


@dataclass
class DeviceLane:
    """What the backend saw of one device: its task events, woken on arrival."""

    events: list[dict[str, Any]] = field(default_factory=list)
    replies: list[dict[str, Any]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def until(self, name: str, *, after: int = -1, step: int | None = None) -> dict[str, Any]:
        """The first event ``name`` of a step past ``after`` (or of ``step``)."""
        async with asyncio.timeout(ROUND_WAIT_S):
            while True:
                for e in self.events:
                    index = e.get("step_index")
                    if e.get("event") != name:
                        continue
                    if step is not None and index != step:
                        continue
                    if index is not None and index <= after:
                        continue
                    return e
                self.changed.clear()
                await self.changed.wait()


async def route(backend: ClientSession, lanes: dict[str, DeviceLane]) -> None:
    while True:
        msg = await backend.queue.get()
        dev = msg.topic.rsplit("/", 1)[-1]
        lane = lanes.get(dev)
        if lane is None:
            continue
        body = json.loads(msg.payload)
        (lane.events if "/task/" in msg.topic else lane.replies).append(body)
        lane.changed.set()


QUESTION = re.compile(r"What is (\d+) (plus|minus) (\d+)\?")


async def heard_question(device: BenchDevice, after: int) -> tuple[int, int]:
    """The answer to the next question the device was told (its ``sentence_start`` text, as
    the child hears it), once it has been said (``tts stop``: the window opens then); and the
    inbox position after that ``tts stop``."""
    while True:
        msg = await device.expect(
            "tts", state="sentence_start", after=after, timeout_s=ROUND_WAIT_S
        )
        at = next(i for i in range(after, len(device.inbox)) if device.inbox[i] is msg)
        after = at + 1
        found = QUESTION.fullmatch(str(msg.get("text", "")))
        if found is None:
            continue  # the intro or a feedback line
        a, op, b = int(found[1]), found[2], int(found[3])
        stop = await device.expect("tts", state="stop", after=after, timeout_s=ROUND_WAIT_S)
        after = next(i for i in range(after, len(device.inbox)) if device.inbox[i] is stop) + 1
        return (a + b if op == "plus" else a - b), after


async def child(
    dev: str,
    device: BenchDevice,
    lane: DeviceLane,
    backend: ClientSession,
    *,
    rounds: int,
    seed: int,
    start_at: float,
    reaction_s: float,
    answers: list[list[bytes]],
) -> list[AnsweredRound]:
    """Start the task at ``start_at`` (epoch s), then answer each question ``reaction_s``
    after it was said. The k-th question is the task's step k (a generate step's rounds are
    its only steps with a window)."""
    await asyncio.sleep(max(0.0, start_at - time.time()))
    seen = len(device.inbox)
    request = {"v": 1, "id": f"b{seed}", "action": "start", "app_id": "thinking_games",
               "task_id": TASK, "priority": 3, "params": {"seed": seed}}  # fmt: skip
    await backend.publish(f"snlpgw/v1/ctl/{dev}", json.dumps(request))
    done: list[AnsweredRound] = []
    last_step = -1
    for _ in range(rounds):
        expected, seen = await heard_question(device, seen)
        r = AnsweredRound(
            step=-1, question_said=time.time(), answer_ms=60.0 * len(answers[expected])
        )
        await asyncio.sleep(reaction_s)  # the child thinks, then speaks
        device.current = r
        r.answer_start = time.time()
        await device.stream_opus(answers[expected], speed=1.0)
        r.last_packet = time.time()
        done.append(r)
        # The window this answer closed: the first one closed after the answer began (one
        # closed before it was a question this device did not hear in time: its window timed
        # out). None when not seen: counted as a round without a listen end.
        with contextlib.suppress(TimeoutError):
            while True:
                closed = await lane.until("window.closed", after=last_step)
                last_step = int(closed["step_index"])
                if closed["data"]["actual_close_ms"] >= r.answer_start * 1000:
                    r.step, r.close_ms = last_step, float(closed["data"]["actual_close_ms"])
                    break
    with contextlib.suppress(TimeoutError):
        await lane.until("instance.completed")
    for r in done:
        for e in lane.events:
            if e.get("event") == "step.signals" and e.get("step_index") == r.step:
                r.signals_ms = float(e["ts"])
    return done


@dataclass
class BenchFleet:
    devices: dict[str, BenchDevice]
    boards: dict[str, BoardSimulator]


@dataclass(frozen=True)
class InlineBrokerAt:
    """The broker the parent started (host, port) and a login on it."""

    host: str
    port: int


@dataclass(frozen=True)
class InlineLogin:
    username: str
    password: str


@contextlib.asynccontextmanager
async def fleet(
    broker: InlineBrokerAt, devices_spec: dict[str, list[str]]
) -> AsyncIterator[BenchFleet]:
    """Every device online: its board (MQTT, heartbeats) and its Xiaozhi side (MQTT + UDP).
    ``devices_spec``: device id → [broker password, the client uuid its binding has]."""
    devices: dict[str, BenchDevice] = {}
    boards: dict[str, BoardSimulator] = {}
    for dev, (password, client) in devices_spec.items():
        device = BenchDevice(mac=dev.replace("_", ":"), board="bench")
        device.uuid = client
        device.mqtt_info = MqttInfo(
            endpoint=f"{broker.host}:{broker.port}",
            client_id=f"GID_bench@@@{dev}@@@{client}",
            username=dev,
            password=password,
            publish_topic=f"device-server/{dev}",
            subscribe_topic=f"devices/p2p/{dev}",
        )
        devices[dev] = device
        boards[dev] = BoardSimulator(
            dev,
            host=broker.host,
            port=broker.port,
            username=dev,
            password=password,
            options=SimOptions(heartbeat_s=5.0),
        )
    gate = asyncio.Semaphore(CONNECT_AT_ONCE)
    async with contextlib.AsyncExitStack() as stack, asyncio.TaskGroup() as tg:
        runs = [tg.create_task(b.run(), name=f"bench.board[{d}]") for d, b in boards.items()]

        async def online(dev: str) -> None:
            async with gate:
                await stack.enter_async_context(devices[dev])
                await devices[dev].open_audio_channel(timeout_s=30)
                # The gateway learns a device's UDP address from its first datagram; SPEAK
                # gives up on a device it cannot reach (``device_unreachable``), so the device
                # sends a little silence first, as chat_tts_bench does.
                await devices[dev].stream_opus(encode_pcm(silence(120)), speed=4.0)
                async with asyncio.timeout(30):
                    await boards[dev].connected.wait()

        try:
            async with asyncio.TaskGroup() as joining:
                for dev in devices:
                    joining.create_task(online(dev), name=f"bench.online[{dev}]")
            yield BenchFleet(devices, boards)
        finally:
            for run in runs:
                run.cancel()


async def caught(
    work: Coroutine[Any, Any, list[AnsweredRound]],
) -> list[AnsweredRound] | BaseException:
    """A device's outcome, its failure included (one device failing must not end the case)."""
    try:
        return await work
    except Exception as exc:
        return exc


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    """The worker's life: online, ready, ``go``, every device's rounds; its figures."""
    answers = answer_packets(spec["tail_ms"])
    broker = InlineBrokerAt(spec["host"], spec["port"])
    devices_spec: dict[str, list[str]] = spec["devices"]
    lanes = {dev: DeviceLane() for dev in devices_spec}
    name, password = spec["backend"]
    async with (
        mqtt_client(broker, InlineLogin(name, password)) as backend,
        fleet(broker, devices_spec) as online,
        asyncio.TaskGroup() as tg,
    ):
        for dev in devices_spec:
            for kind in ("task", "reply"):
                await backend.subscribe(f"snlpgw/v1/{kind}/{dev}")
        router = tg.create_task(route(backend, lanes), name="bench.route")
        sys.stdout.write(json.dumps({"ready": len(devices_spec)}) + "\n")
        sys.stdout.flush()
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        hold_gc()  # from here on it measures
        t0 = float(line.split()[1])
        cpu0 = time.process_time()
        kids = [
            tg.create_task(
                caught(
                    child(
                        dev,
                        online.devices[dev],
                        lanes[dev],
                        backend,
                        rounds=spec["rounds"],
                        seed=seed,
                        start_at=t0 + offset,
                        reaction_s=spec["reaction_s"],
                        answers=answers,
                    )
                ),
                name=f"bench.child[{dev}]",
            )
            for dev, seed, offset in zip(
                devices_spec, spec["seeds"], spec["offsets_s"], strict=True
            )
        ]
        results = [await kid for kid in kids]
        cpu_s = time.process_time() - cpu0
        router.cancel()
    return {
        "devices": len(devices_spec),
        "rounds": [asdict(r) for rs in results if not isinstance(rs, BaseException) for r in rs],
        "failures": [repr(r) for r in results if isinstance(r, BaseException)],
        "cpu_s": round(cpu_s, 3),
    }


def main() -> int:
    die_with_parent()
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    result = asyncio.run(run(spec))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # the figures are out: no goodbyes for hundreds of clients


if __name__ == "__main__":
    sys.exit(main())
