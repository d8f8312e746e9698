"""The gateway's per-frame code against the floor, in one process, finely interleaved (#12 item 3).

Run from the repo root: ``python -m bench.stream_path_bench [note]``. No broker: the Xiaozhi
channel is built as in production (as :mod:`bench.hello_core_bench` builds it), K devices say
hello, and their sealed speech datagrams go through the UDP endpoint and the audio pump
(routing, source/sequence/rate checks, AES-CTR, Opus decode, VAD) in two ways:

* ``socket``: sent to a real bound UDP socket and read back by the endpoint's own batch read
  (``recvfrom`` per datagram, as in the service); only the endpoint's read and the pump's turns
  are timed, not the sending;
* ``direct``: each datagram handed to the endpoint's per-datagram handler (no syscalls).

The floor (:mod:`bench.load.floor`: the libraries called directly) is measured in the same
process in between: every chunk of ``CHUNK_TICKS`` ticks of all K sessions is followed by two
floor passes, so both see the same host speed (this VM runs at two speeds that change within
seconds). Reported: CPU µs per frame of each and their ratio, floor / path (≥ 0.75 is the
issue's target for the whole gateway process; this isolates the gateway's own code from the
process's loop, other work and cache effects, which the load harness includes).
Writes bench/results/stream_path.json and stream_path.md.
"""

from __future__ import annotations

import asyncio
import gc
import platform
import socket
import sys
import time
from typing import Any

from bench.hello_core_bench import bench_channel, hello_messages
from bench.load.floor import floor_loop, wire
from bench.scale_sender import speech_loop
from bench.stats import record
from codec.udp import UplinkSender
from gateway.simulators.xiaozhi import parse_server_hello
from gateway.xiaozhi.channel import XiaozhiChannel
from tests.support.fake_mqtt import FakePublisher

SESSIONS = 400
CHUNKS = 30
CHUNK_TICKS = 5  # 60 ms ticks of every session per chunk (2,000 frames at 400 sessions)
WARMUP_TICKS = 20
BATCH = 16  # datagrams between pump turns (the service reads ~27 per 4 ms at 400 sessions)
REPEATS = 3


def open_sessions(channel: XiaozhiChannel, mqtt: FakePublisher, k: int) -> list[UplinkSender]:
    """K hellos through the channel's control route; a device-side sealer per session."""
    ((_, handle, _),) = mqtt.routes
    for msg in hello_messages(k):
        handle(msg)
    senders = []
    for published in mqtt.sent:
        hello = parse_server_hello(published.json())
        if hello is not None:
            ssrc = int.from_bytes(hello.nonce[4:8], "big")
            senders.append(UplinkSender(key=hello.key, ssrc=ssrc))
    assert len(senders) == k, f"{len(senders)} sessions opened of {k}"
    return senders


class PathRig:
    """K open sessions on a production-built channel, their datagrams sealed in advance, and a
    bound UDP socket the endpoint reads (mode ``socket``) or not (``direct``)."""

    def __init__(self, mode: str, k: int) -> None:
        self.mode = mode
        channel, mqtt = bench_channel(k)
        self.endpoint = channel.udp_endpoint
        self.pump = channel._pump
        senders = open_sessions(channel, mqtt, k)
        frames = speech_loop()
        self.datagrams = [
            [s.seal(frames[t % len(frames)], t * 60) for s in senders]
            for t in range(WARMUP_TICKS + CHUNKS * CHUNK_TICKS)
        ]
        self.rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.txs = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in senders]
        self.rx.bind(("127.0.0.1", 0))
        self.rx.setblocking(False)
        self.rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.target = self.rx.getsockname()
        for tx in self.txs:
            tx.bind(("127.0.0.1", 0))
        self.addresses = [tx.getsockname() for tx in self.txs]
        # The socket the endpoint batch-reads (drain_from would also take over a real
        # transport's readiness callback; here nothing waits on readiness: the bench reads).
        self.endpoint._sock = self.rx

    def close(self) -> None:
        self.rx.close()
        for tx in self.txs:
            tx.close()

    def batch(self, row: list[bytes], lo: int, hi: int) -> float:
        """One batch of datagrams through the endpoint, then pump turns until every queue is
        empty: the CPU seconds of that (not of the sending)."""
        clock = time.thread_time
        if self.mode == "socket":
            for j in range(lo, hi):
                self.txs[j].sendto(row[j], self.target)
            t0 = clock()
            self.endpoint._read()
        else:
            one = self.endpoint._one
            t0 = clock()
            for j in range(lo, hi):
                one(row[j], self.addresses[j])
        while self.pump.pending:
            self.pump.turn()
        return clock() - t0

    def run(self, first: int, count: int) -> tuple[float, int]:
        """Ticks ``first`` .. ``first + count`` of every session: CPU seconds, frames."""
        used, frames = 0.0, 0
        for t in range(first, first + count):
            row = self.datagrams[t]
            for lo in range(0, len(row), BATCH):
                used += self.batch(row, lo, min(lo + BATCH, len(row)))
            frames += len(row)
        return used, frames


async def measure(mode: str, k: int = SESSIONS) -> dict[str, Any]:
    """One run: chunks of the path, two floor passes after each (a loop is running, as in the
    service, so the pipelines' batched counters flush once per turn)."""
    rig = PathRig(mode, k)
    spent, path_frames, floor_us = 0.0, 0, []
    try:
        with floor_loop() as floor_pass:
            rig.run(0, WARMUP_TICKS)  # binds every session's source, warms the decoders
            floor_pass()
            gc.collect()
            gc.freeze()
            for c in range(CHUNKS):
                used, frames = rig.run(WARMUP_TICKS + c * CHUNK_TICKS, CHUNK_TICKS)
                spent += used
                path_frames += frames
                floor_us += [floor_pass(), floor_pass()]
            gc.unfreeze()
    finally:
        rig.close()
    path = spent / path_frames * 1e6
    floor = sum(floor_us) / len(floor_us)
    return {
        "mode": mode,
        "sessions": k,
        "frames": path_frames,
        "path_us_per_frame": round(path, 2),
        "floor_us_per_frame": round(floor, 2),
        "ratio": round(floor / path, 3),
    }


def run_all(repeats: int = REPEATS) -> dict[str, Any]:
    runs = []
    for _ in range(repeats):
        for mode in ("socket", "direct"):
            runs.append(asyncio.run(measure(mode)))
            sys.stdout.write(f"{runs[-1]}\n")
    return {
        "benchmark": "gateway per-frame code vs the floor, in-process, interleaved",
        "floor_frames_per_pass": len(wire()),
        "chunk_ticks": CHUNK_TICKS,
        "batch": BATCH,
        "runs": runs,
        "machine": {"python": platform.python_version(), "cpu": platform.machine()},
    }


def markdown(result: dict[str, Any], note: str) -> str:
    rows = [
        "# Streaming path in-process vs the floor (interleaved)",
        "",
        f"{result['benchmark']}: `python -m bench.stream_path_bench`. *socket*: datagrams read by "
        "the endpoint from a real UDP socket (recvfrom each, as in the service); *direct*: handed "
        "to its per-datagram handler. Both: routing, checks, AES-CTR, pump, Opus, VAD.",
        f"Each run: {CHUNKS} chunks of {CHUNK_TICKS} ticks x {SESSIONS} sessions, two floor "
        f"passes ({result['floor_frames_per_pass']} frames each) after every chunk; pump turn "
        f"every {result['batch']} datagrams. CPU time of the measuring thread.",
        "",
        "| mode | sessions | frames | path µs/frame | floor µs/frame | floor / path |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        rows.append(
            f"| {r['mode']} | {r['sessions']} | {r['frames']} | {r['path_us_per_frame']} | "
            f"{r['floor_us_per_frame']} | {r['ratio']} |"
        )
    rows += ["", note, ""]
    return "\n".join(rows)


def main() -> None:
    result = run_all()
    note = " ".join(sys.argv[1:]) or "Machine shared with other work while measured."
    record("stream_path", result, markdown(result, note))


if __name__ == "__main__":
    main()
