"""The scale benchmark's device side, in a process of its own (``bench.scale_bench`` starts it).

One MQTT connection says the firmware's hello for every device id in the spec and reads each
reply (session key, nonce, UDP endpoint). Each session's uplink is then sealed ahead of time
(real espeak speech with pauses as 60 ms Opus frames, each session starting at a different
point of the loop), and one thread sends all sessions' datagrams in real time from one UDP
socket, the sessions spread over twelve 5 ms slots of each 60 ms tick. Prints one JSON line
when sending starts and one with the totals when done. :func:`running_sender` is the parent's
side (the scale, chat and load-harness streaming benchmarks).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiomqtt

from gateway.chat import espeak as audio
from gateway.simulators.xiaozhi import (
    FRAME_MS,
    DeviceUdpCrypto,
    ServerHelloParams,
    encode_pcm,
    hello_json,
    parse_server_hello,
)

SLOTS = 12  # per 60 ms tick
SPEECH = (
    "Good morning, how are you today?",
    "I would like to read a book about the ocean.",
    "See you later, alligator.",
)
HELLO_TIMEOUT_S = 30.0
LATE_S = 0.020


def speech_loop() -> list[bytes]:
    """A few seconds of speech and pauses as Opus packets (encoded once, shared)."""
    pcm = b"".join(audio.silence(700) + audio.synthesize(text) for text in SPEECH)
    return encode_pcm(pcm + audio.silence(700))


async def open_sessions(spec: dict[str, Any]) -> dict[str, ServerHelloParams]:
    devs: list[str] = spec["devices"]
    hellos: dict[str, ServerHelloParams] = {}
    async with aiomqtt.Client(
        spec["host"],
        spec["port"],
        username="snlp-gateway",
        password=spec["password"],
        identifier="bench-scale-sender",
    ) as client:
        await client.subscribe("devices/p2p/+", qos=0)
        body = hello_json()
        for dev in devs:
            await client.publish(f"device-server/{dev}", body, qos=0)
        async with asyncio.timeout(HELLO_TIMEOUT_S):
            async for msg in client.messages:
                raw = msg.payload if isinstance(msg.payload, bytes) else b"{}"
                hello = parse_server_hello(json.loads(raw))
                if hello is not None:
                    hellos[msg.topic.value.rsplit("/", 1)[1]] = hello
                if len(hellos) == len(devs):
                    break
    return hellos


def seal_all(hellos: dict[str, ServerHelloParams], frames: int) -> list[list[bytes]]:
    """Every session's datagrams for ``frames`` ticks, from its own point of the speech loop."""
    loop = speech_loop()
    sealed = []
    for index, hello in enumerate(hellos.values()):
        crypto = DeviceUdpCrypto(hello.key, hello.nonce)
        offset = index * 7
        packets = [loop[(offset + i) % len(loop)] for i in range(frames)]
        sealed.append([crypto.seal(p, timestamp=i * FRAME_MS) for i, p in enumerate(packets)])
    return sealed


def send(sealed: list[list[bytes]], target: tuple[str, int], frames: int) -> dict[str, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * 1024 * 1024)
    slots = [sealed[s::SLOTS] for s in range(SLOTS)]
    sent = late = errors = 0
    start = time.monotonic() + 0.1
    for tick in range(frames):
        for slot, sessions in enumerate(slots):
            due = start + tick * FRAME_MS / 1000 + slot * FRAME_MS / 1000 / SLOTS
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            elif delay < -LATE_S:
                late += 1
            for datagrams in sessions:
                try:
                    sock.sendto(datagrams[tick], target)
                    sent += 1
                except OSError:
                    errors += 1
    sock.close()
    return {"sent": sent, "late_ticks": late, "send_errors": errors}


@dataclass
class Sender:
    """The sender process, once every session is open and it sends (``ready``)."""

    proc: asyncio.subprocess.Process
    ready: dict[str, Any]

    async def totals(self, timeout_s: float) -> dict[str, Any]:
        """Wait for the sender to finish; its totals line."""
        async with asyncio.timeout(timeout_s):
            out, _ = await self.proc.communicate()
        totals: dict[str, Any] = json.loads(out.splitlines()[-1])
        return totals


@contextlib.asynccontextmanager
async def running_sender(
    spec_path: Path,
    *,
    host: str,
    port: int,
    password: str | None,
    devices: list[str],
    seconds: float,
    ready_s: float = 60.0,
) -> AsyncIterator[Sender]:
    """This module in a process of its own, sending for ``seconds`` once every device's hello
    was answered; killed if still running when the block exits."""
    spec = {"host": host, "port": port, "password": password, "devices": devices}
    await asyncio.to_thread(spec_path.write_text, json.dumps({**spec, "seconds": seconds}))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.scale_sender", str(spec_path), stdout=asyncio.subprocess.PIPE
    )
    try:
        if proc.stdout is None:  # PIPE was requested
            raise RuntimeError("no pipe from the sender")
        async with asyncio.timeout(ready_s):
            ready = json.loads(await proc.stdout.readline())  # sessions open, sending
        yield Sender(proc, ready)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    hellos = asyncio.run(open_sessions(spec))
    frames = int(spec["seconds"] * 1000 / FRAME_MS) + 1
    sealed = seal_all(hellos, frames)
    first = next(iter(hellos.values()))
    sys.stdout.write(json.dumps({"sessions": len(hellos)}) + "\n")
    sys.stdout.flush()
    result = send(sealed, (first.server, first.port), frames)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
