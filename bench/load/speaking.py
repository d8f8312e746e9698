"""Boards that answer with real speech: the child's side of a lesson with assessment on.

Each board worker (:mod:`bench.load.boards`) with a ``speech`` section in its spec opens one
Xiaozhi voice session per board (the firmware's hello on ``device-server/{dev}``, said for every
board over one MQTT connection, as :mod:`bench.scale_sender` does; the reply's AES key, nonce
and UDP endpoint kept per board). The answers are espeak-ng speech synthesized once per worker
and encoded once as 60 ms Opus packets (:func:`gateway.simulators.xiaozhi.encode_pcm`), so the
only work at send time is the per-board AES-CTR seal (the device's sequence numbers) and one
``sendto`` per packet.

When a board receives a window's ``LISTEN_START`` it starts reading the clip's sentence: a
short lead of silence, the sentence, a tail of silence long enough for the gateway's VAD to
close the utterance inside the window; one packet per 60 ms in real time, sent by one ticker
per worker (every 10 ms, each board from its own start time, so the datagrams of staggered
lessons stay spread). The gateway attributes the utterance to the board's lesson by the device
id (``VoiceToTasks``), exactly as for a real board with a Xiaozhi voice channel.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass
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

TICK_S = 0.010
HELLO_TIMEOUT_S = 60.0


async def open_sessions(spec: dict[str, Any], worker: int) -> dict[str, ServerHelloParams]:
    """The firmware's hello for each of ``spec["devices"]``, said on the gateway's account over
    one connection (:func:`bench.scale_sender.open_sessions`, with a client id per worker and
    only this worker's replies kept); each reply the firmware would accept, by device."""
    devs = set(spec["devices"])
    hellos: dict[str, ServerHelloParams] = {}
    async with aiomqtt.Client(
        spec["host"], spec["port"], username="snlp-gateway", password=spec["password"],
        identifier=f"load-speech-{worker}",
    ) as client:  # fmt: skip
        await client.subscribe("devices/p2p/+", qos=0)
        body = hello_json()
        for dev in sorted(devs):
            await client.publish(f"device-server/{dev}", body, qos=0)
        async with asyncio.timeout(HELLO_TIMEOUT_S):
            async for msg in client.messages:
                dev = msg.topic.value.rsplit("/", 1)[1]
                raw = msg.payload if isinstance(msg.payload, bytes) else b"{}"
                hello = parse_server_hello(json.loads(raw))
                if dev in devs and hello is not None:
                    hellos[dev] = hello
                if len(hellos) == len(devs):
                    break
    return hellos


def answer_packets(sentences: list[str], lead_ms: int, tail_ms: int) -> list[list[bytes]]:
    """Each sentence as the Opus packets of lead silence + speech + tail silence."""
    return [
        encode_pcm(audio.silence(lead_ms) + audio.synthesize(s) + audio.silence(tail_ms))
        for s in sentences
    ]


@dataclass
class _Reading:
    crypto: DeviceUdpCrypto
    target: tuple[str, int]
    packets: list[bytes]
    start: float  # monotonic s
    sent: int = 0


class SpokenAnswerReader:
    """Every board's voice session of one worker, and the ticker that reads answers into them."""

    def __init__(self, spec: dict[str, Any]) -> None:
        speech = spec["speech"]
        self.sentences: list[str] = speech["sentences"]
        self.answers = answer_packets(self.sentences, speech["lead_ms"], speech["tail_ms"])
        # When each answer's speech ends after its first packet (lead + speech), ms
        self.voiced_ms = [
            speech["lead_ms"] + len(audio.synthesize(s)) // 32 for s in self.sentences
        ]
        self.ends: dict[tuple[str, int], float] = {}  # (device, clip) → speech end, monotonic ms
        self.spec = spec
        self.every: int = speech.get("every", 1)  # speak in one window of ``every``
        self.index = {
            dev: int(dev.rsplit("_", 2)[1] + dev.rsplit("_", 2)[2], 16) for dev in spec["devices"]
        }
        self.sessions: dict[str, tuple[DeviceUdpCrypto, tuple[str, int]]] = {}
        self.reading: dict[str, _Reading] = {}
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * 1024 * 1024)
        self.sock.setblocking(False)
        self.started = 0  # answers begun
        self.packets_sent = 0
        self.send_errors = 0
        self.busy = 0  # LISTEN_START while the previous answer was still being read

    async def open(self) -> None:
        """The firmware's hello for every board; its session kept (key, nonce, endpoint)."""
        spec = self.spec
        hellos = await open_sessions(
            {"host": spec["host"], "port": spec["port"], "password": spec["speech"]["password"],
             "devices": list(spec["devices"])},
            spec["worker"],
        )  # fmt: skip
        for dev, hello in hellos.items():
            self.sessions[dev] = (
                DeviceUdpCrypto(hello.key, hello.nonce),
                (hello.server, hello.port),
            )

    def listen_started(self, dev: str, clip: int) -> None:
        """A window opened on ``dev`` for clip ``clip`` (0-based): read its sentence now."""
        session = self.sessions.get(dev)
        if session is None or (self.index[dev] + clip) % self.every:
            return
        if dev in self.reading:
            self.busy += 1
        crypto, target = session
        packets = self.answers[clip % len(self.answers)]
        now = time.monotonic()
        self.reading[dev] = _Reading(crypto, target, packets, now)
        self.ends[(dev, clip)] = now * 1000 + self.voiced_ms[clip % len(self.answers)]
        self.started += 1

    async def run(self) -> None:
        """Until cancelled: every 10 ms, each reading board's packets that are due."""
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            finished = []
            for dev, r in self.reading.items():
                due = int((now - r.start) * 1000 // FRAME_MS) + 1
                while r.sent < min(due, len(r.packets)):
                    datagram = r.crypto.seal(r.packets[r.sent], timestamp=r.sent * FRAME_MS)
                    try:
                        self.sock.sendto(datagram, r.target)
                        self.packets_sent += 1
                    except OSError:
                        self.send_errors += 1
                    r.sent += 1
                if r.sent >= len(r.packets):
                    finished.append(dev)
            for dev in finished:
                del self.reading[dev]

    def report(self) -> dict[str, Any]:
        return {
            "sessions_opened": len(self.sessions),
            "answers_started": self.started,
            "answers_overlapping": self.busy,
            "packets_sent": self.packets_sent,
            "send_errors": self.send_errors,
            "answer_ms": [len(p) * FRAME_MS for p in self.answers],
        }
