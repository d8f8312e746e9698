"""Boards that answer with real speech: the child's side of a lesson with assessment on.

Each board worker (:mod:`bench.load.boards`) with a ``speech`` section in its spec opens one
Xiaozhi voice session per board (the firmware's hello on ``device-server/{dev}``, said for every
board over one MQTT connection, as :mod:`bench.scale_sender` does; the reply's AES key, nonce
and UDP endpoint kept per board). The answers are espeak-ng speech synthesized once per worker
and encoded once as 60 ms Opus packets (:func:`gateway.simulators.xiaozhi.encode_pcm`), so the
only work at send time is the per-board AES-CTR seal (the device's sequence numbers:
:class:`CtrSealer`, the same bytes as the simulator's ``DeviceUdpCrypto``) and one ``send`` per
packet.

When a board receives a window's ``LISTEN_START`` it starts reading the clip's sentence: a
short lead of silence, the sentence, a tail of silence long enough for the gateway's VAD to
close the utterance inside the window; one packet per 60 ms in real time, sent by one ticker
per worker (every 10 ms, each board from its own start time, so the datagrams of staggered
lessons stay spread). The gateway attributes the utterance to the board's lesson by the device
id (``VoiceToTasks``), exactly as for a real board with a Xiaozhi voice channel.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import socket
import time
from dataclasses import dataclass
from typing import Any

import aiomqtt
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from gateway.chat import espeak as audio
from gateway.simulators.xiaozhi import (
    FRAME_MS,
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


_MAX_BLOCKS = 128  # 2 KiB: above the largest datagram (the gateway's MAX_DATAGRAM)


class CtrSealer:
    """The device's UDP seal (:meth:`DeviceUdpCrypto.seal`: the same header, AES-CTR with the
    header as the initial counter block, the same sequence numbers: the same bytes on the
    wire) at a fraction of its CPU, for a worker sealing ~1,400 packets a second: one AES-ECB
    context per session, reused, encrypts the packet's counter blocks (built as one integer)
    into its key stream; ``DeviceUdpCrypto`` builds a new ``Cipher`` per packet (~16-44 µs of
    a busy core against ~4 here)."""

    __slots__ = ("_base", "_ecb", "sequence")

    def __init__(self, key: bytes, nonce: bytes) -> None:
        # ECB here only makes CTR's key stream (counter blocks in, one per 16 bytes out)
        self._ecb = Cipher(algorithms.AES(key), modes.ECB()).encryptor()  # noqa: S305
        # The nonce's type, flags and ssrc (bytes 0-1, 4-7) stay; length, timestamp and
        # sequence (bytes 2-3, 8-15) are the packet's.
        self._base = int.from_bytes(nonce[:2] + b"\0\0" + nonce[4:8] + bytes(8), "big")
        self.sequence = 0

    def seal(self, packet: OpusPacket) -> bytes:
        self.sequence += 1
        n, blocks = packet.size, packet.blocks
        iv = self._base | packet.fields | self.sequence
        # The counter blocks iv, iv + 1, … (CTR adds across all 128 bits) as one integer; the
        # length field (≤ 2,048 < 0xffff) keeps the sum below 2**128.
        counters = (iv * _REPUNIT[blocks] + _STEPS[blocks]).to_bytes(16 * blocks, "big")
        stream = self._ecb.update(counters)
        sealed = (int.from_bytes(stream[:n], "big") ^ packet.value).to_bytes(n, "big")
        return iv.to_bytes(16, "big") + sealed


# Per block count b: sum of 2**(128 k) for k < b, and sum of j * 2**(128 (b - 1 - j)) for j < b
_REPUNIT = [sum(1 << 128 * k for k in range(b)) for b in range(_MAX_BLOCKS + 1)]
_STEPS = [sum(j << 128 * (b - 1 - j) for j in range(b)) for b in range(_MAX_BLOCKS + 1)]


@dataclass(frozen=True, slots=True)
class OpusPacket:
    """One pre-encoded packet with what sealing it needs, computed once per answer."""

    value: int  # the Opus bytes as a big-endian integer
    size: int
    blocks: int  # AES blocks of key stream
    fields: int  # length and timestamp, placed in the 16-byte header as an integer

    @classmethod
    def of(cls, opus: bytes, timestamp: int) -> OpusPacket:
        blocks = -(-len(opus) // 16)
        if not 0 < blocks <= _MAX_BLOCKS:
            raise ValueError(f"an Opus packet of {len(opus)} bytes")
        fields = (len(opus) << 96) | ((timestamp & 0xFFFFFFFF) << 32)
        return cls(int.from_bytes(opus, "big"), len(opus), blocks, fields)


@dataclass(slots=True)
class _Reading:
    dev: str
    sealer: CtrSealer
    sock: socket.socket
    packets: list[OpusPacket]
    start: float  # monotonic s
    sent: int = 0
    live: bool = True  # False once a newer answer of the same board replaced it


class SpokenAnswerReader:
    """Every board's voice session of one worker, and the ticker that reads answers into them.

    Per tick only the packets that are due are touched: the readings wait in a heap by their
    next packet's due time (a tick used to walk every reading board, ~500 per worker, to find
    the ~1 in 6 with a packet due); each packet is sealed by its session's
    :class:`CtrSealer` and sent with one ``send`` on a connected non-blocking socket per
    gateway endpoint (all sessions of a worker share it: the gateway routes a datagram by its
    ssrc and binds each session to the address it came from, which may be shared)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        speech = spec["speech"]
        self.sentences: list[str] = speech["sentences"]
        self.answers = answer_packets(self.sentences, speech["lead_ms"], speech["tail_ms"])
        self._prepared = [
            [OpusPacket.of(opus, i * FRAME_MS) for i, opus in enumerate(packets)]
            for packets in self.answers
        ]
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
        self.sessions: dict[str, tuple[CtrSealer, socket.socket]] = {}
        self.reading: dict[str, _Reading] = {}
        self._due: list[tuple[float, int, _Reading]] = []  # (next packet due, tie, reading)
        self._ties = itertools.count()
        self._sockets: dict[tuple[str, int], socket.socket] = {}
        self.started = 0  # answers begun
        self.packets_sent = 0
        self.send_errors = 0
        self.busy = 0  # LISTEN_START while the previous answer was still being read

    def _socket(self, target: tuple[str, int]) -> socket.socket:
        sock = self._sockets.get(target)
        if sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * 1024 * 1024)
            sock.setblocking(False)
            sock.connect(target)
            self._sockets[target] = sock
        return sock

    async def open(self) -> None:
        """The firmware's hello for every board; its session kept (key, nonce, endpoint)."""
        spec = self.spec
        hellos = await open_sessions(
            {"host": spec["host"], "port": spec["port"], "password": spec["speech"]["password"],
             "devices": list(spec["devices"])},
            spec["worker"],
        )  # fmt: skip
        for dev, hello in hellos.items():
            target = socket.gethostbyname(hello.server), hello.port
            self.sessions[dev] = (CtrSealer(hello.key, hello.nonce), self._socket(target))

    def listen_started(self, dev: str, clip: int) -> None:
        """A window opened on ``dev`` for clip ``clip`` (0-based): read its sentence now."""
        session = self.sessions.get(dev)
        if session is None or (self.index[dev] + clip) % self.every:
            return
        previous = self.reading.get(dev)
        if previous is not None:
            self.busy += 1
            previous.live = False
        sealer, sock = session
        packets = self._prepared[clip % len(self._prepared)]
        now = time.monotonic()
        reading = _Reading(dev, sealer, sock, packets, now)
        self.reading[dev] = reading
        heapq.heappush(self._due, (now, next(self._ties), reading))
        self.ends[(dev, clip)] = now * 1000 + self.voiced_ms[clip % len(self.answers)]
        self.started += 1

    async def run(self) -> None:
        """Until cancelled: every 10 ms, each reading board's packets that are due."""
        while True:
            await asyncio.sleep(TICK_S)
            self.tick(time.monotonic())

    def tick(self, now: float) -> None:
        """Send every packet due by ``now`` (packet k of an answer is due k * 60 ms after its
        start), oldest due first."""
        due, frame_s = self._due, FRAME_MS / 1000
        while due and due[0][0] <= now:
            _, tie, r = heapq.heappop(due)
            if not r.live:
                continue
            try:
                r.sock.send(r.sealer.seal(r.packets[r.sent]))
                self.packets_sent += 1
            except OSError:
                self.send_errors += 1
            r.sent += 1
            if r.sent < len(r.packets):
                heapq.heappush(due, (r.start + r.sent * frame_s, tie, r))
            else:
                r.live = False
                if self.reading.get(r.dev) is r:
                    del self.reading[r.dev]

    def report(self) -> dict[str, Any]:
        return {
            "sessions_opened": len(self.sessions),
            "answers_started": self.started,
            "answers_overlapping": self.busy,
            "packets_sent": self.packets_sent,
            "send_errors": self.send_errors,
            "answer_ms": [len(p) * FRAME_MS for p in self.answers],
        }
