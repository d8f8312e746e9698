"""CHAT bridge: added latency per uplink frame and bridged sessions per core (issue 11).

Run from the repo root: ``python -m bench.chat_bench``. For each K: a local Mosquitto, the
composed gateway in this process with ``chat.upstream_url`` pointing at the xiaozhi server
peer (tests/support) running in a child process, and the scale benchmark's device sender
(``bench.scale_sender``, another child) saying hello for K devices and streaming real 60 ms
Opus speech in real time. Every session is bridged: one WebSocket each, ``listen start`` (auto)
issued through the chat component's control entry, so every frame is decrypted, decoded + VAD'd
(the silence timeout) and relayed upstream unchanged.

Latency: for each frame the gateway forwards, the time the chat tap took it (right after
decryption, in ``datagram_received``) to the time the peer process received it on its
WebSocket (``time.monotonic()``, one clock for all processes on Linux) — what the bridge adds
on top of the UDP hop. CPU: the gateway process's CPU time over the measured window (the peer,
the sender and Mosquitto are other processes). Writes bench/results/chat.json and chat.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.scale_sender import running_sender
from bench.stats import quantile, record
from devstack.broker import local_broker
from devstack.gateway import Use, gateway_settings, running_gateway
from gateway.chat.component import ChatComponent

SIZES = (10, 50, 100, 200)
WARMUP_S = 3.0
MEASURE_S = 8.0
FRAME_S = 0.060
SUSTAINED_CPU_SHARE = 0.85


def device_ids(k: int) -> list[str]:
    return [f"a6_00_00_00_{i >> 8:02x}_{i & 0xFF:02x}" for i in range(k)]


async def _line(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    assert proc.stdout is not None  # PIPE was requested
    async with asyncio.timeout(60):
        line: dict[str, Any] = json.loads(await proc.stdout.readline())
    return line


async def run_size(k: int, root: Path) -> dict[str, Any]:
    children: list[asyncio.subprocess.Process] = []
    try:
        return await _run_size(k, root, children)
    finally:
        for child in children:  # never leave the peer behind
            if child.returncode is None:
                child.kill()
                await child.wait()


async def _run_size(  # noqa: PLR0915 - one linear scenario
    k: int, root: Path, children: list[asyncio.subprocess.Process]
) -> dict[str, Any]:
    peer = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.chat_peer",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=1 << 26,
    )  # fmt: skip
    children.append(peer)
    url = (await _line(peer))["url"]
    async with local_broker(root / "data") as broker:
        settings = gateway_settings(
            broker,
            use=Use.LOAD,
            chat={"upstream_url": url, "silence_timeout_s": 600.0, "reply_timeout_s": 600.0},
        )
        taken: dict[str, list[float]] = {}
        before: dict[str, int] = {}
        phase = "warmup"  # warmup → measure → tail (the tail is neither counted nor timed)
        inner = ChatComponent.uplink

        def tap(self: ChatComponent, dev: str, sid: str, opus: bytes) -> None:
            at = time.monotonic()
            device = self.device(dev)
            forwarded = device is not None and device.core.uplink_open
            inner(self, dev, sid, opus)
            if forwarded and phase == "measure":
                taken.setdefault(dev, []).append(at)
            elif forwarded and phase == "warmup":
                before[dev] = before.get(dev, 0) + 1

        # The channel takes CHAT's uplink tap when it is built: time it from there on.
        ChatComponent.uplink = tap  # type: ignore[method-assign]
        try:
            devs = device_ids(k)
            async with (
                running_gateway(settings) as gw,
                running_sender(
                    root / "spec.json", host=broker.host, port=broker.port,
                    password=settings.mqtt.password, devices=devs,
                    seconds=WARMUP_S + MEASURE_S + 1.5,
                ) as sender,
            ):  # fmt: skip
                chat = gw.chat
                assert chat is not None
                ready = sender.ready
                async with asyncio.timeout(30):  # every session bridged (its upstream hello done)
                    while not all(  # noqa: ASYNC110 - no event for "all K bridged"; a bench poll
                        (d := chat.device(x)) and d.bridge and d.bridge.connected for x in devs
                    ):
                        await asyncio.sleep(0.05)
                for dev in devs:
                    sid = gw.xiaozhi.session_id(dev)
                    assert sid is not None
                    chat.listen(dev, sid, "start", "auto", None)  # what the control handler calls
                await asyncio.sleep(WARMUP_S)
                phase = "measure"
                cpu0, t0 = time.process_time(), time.monotonic()
                await asyncio.sleep(MEASURE_S)
                cpu1, t1 = time.process_time(), time.monotonic()
                phase = "tail"
                sent = await sender.totals(60)
                snapshot = gw.service.metrics.snapshot()
                frames_up = snapshot.get("snlpgw_chat_frames_up_total", 0.0)
                received = snapshot.get("snlpgw_xiaozhi_udp_packets_in_total", 0.0)
                dropped = {
                    key: value
                    for key, value in snapshot.items()
                    if value and ("dropped" in key) and "_created" not in key
                }
        finally:
            ChatComponent.uplink = inner  # type: ignore[method-assign]

    assert peer.stdin is not None  # PIPE was requested
    peer.stdin.write(b"dump\n")
    await peer.stdin.drain()
    result = await _line(peer)
    await peer.wait()
    latencies: list[float] = []
    for dev, times in taken.items():
        arrivals = result["arrivals"].get(dev.replace("_", ":"), [])
        start = before.get(dev, 0)
        latencies += [
            (arrivals[start + i] - at) * 1000
            for i, at in enumerate(times)
            if start + i < len(arrivals)
        ]
    wall = t1 - t0
    cpu = cpu1 - cpu0
    bridged_audio_s = len(latencies) * FRAME_S
    cpu_ms_per_audio_s = cpu * 1000 / bridged_audio_s if bridged_audio_s else None
    return {
        "sessions": k,
        "sessions_opened": ready["sessions"],
        "measure_s": round(wall, 2),
        "frames_bridged_in_window": sum(len(t) for t in taken.values()),
        "frames_matched": len(latencies),
        "latency_p50_ms": round(quantile(latencies, 0.5), 3) if latencies else None,
        "latency_p99_ms": round(quantile(latencies, 0.99), 3) if latencies else None,
        "latency_max_ms": round(max(latencies), 3) if latencies else None,
        "gateway_cpu_s": round(cpu, 3),
        "cpu_share_of_one_core": round(cpu / wall, 3),
        # CPU per second of audio bridged, and the sessions one core would carry at that cost
        # (every session streams one second of audio per second)
        "cpu_ms_per_audio_s": round(cpu_ms_per_audio_s, 3) if cpu_ms_per_audio_s else None,
        "sessions_per_core_at_this_cost": int(1000 / cpu_ms_per_audio_s)
        if cpu_ms_per_audio_s
        else None,
        "datagrams_sent": sent["sent"],
        "datagrams_received": received,
        "sender_late_ticks": sent["late_ticks"],
        "frames_up_total": frames_up,
        "bad_frames_at_peer": result["bad"],
        "dropped": dropped,
    }


def sustained(run: dict[str, Any]) -> bool:
    share: float = run["cpu_share_of_one_core"]
    lost = run["datagrams_sent"] - run["datagrams_received"]
    clean = not run["dropped"] and run["bad_frames_at_peer"] == 0 and lost == 0
    return clean and share < SUSTAINED_CPU_SHARE


def write_results(runs: list[dict[str, Any]], load: tuple[float, float, float]) -> None:
    ok = [r["sessions"] for r in runs if sustained(r)]
    doc = {
        "bench": "chat",
        "machine": f"{platform.machine()} {platform.system()} python {platform.python_version()}",
        "load_average_at_end": load,
        "frame_ms": 60,
        "warmup_s": WARMUP_S,
        "measure_s": MEASURE_S,
        "max_sustained_bridged_sessions": max(ok, default=0),
        "runs": runs,
    }
    rows = [
        "# CHAT bridge: added latency per frame, bridged sessions per core\n",
        "K devices stream real 60 ms Opus speech over AES-CTR UDP in real time; every session "
        "is bridged to a xiaozhi-protocol WebSocket peer in another process (one WebSocket "
        "each, `?from=mqtt_gateway` framing); listening on (decrypt + decode + VAD for the "
        "silence timeout). `python -m bench.chat_bench`.\n",
        "| sessions | frames measured | added latency p50 | p99 | max | gateway CPU "
        "(share of a core) | CPU ms per bridged audio s | sessions/core at that cost | "
        "datagrams sent | received | drops |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        rows.append(
            f"| {r['sessions']} | {r['frames_matched']} | {r['latency_p50_ms']} ms | "
            f"{r['latency_p99_ms']} ms | {r['latency_max_ms']} ms | "
            f"{r['cpu_share_of_one_core']:.0%} | {r['cpu_ms_per_audio_s']} | "
            f"{r['sessions_per_core_at_this_cost']} | {r['datagrams_sent']} | "
            f"{int(r['datagrams_received'])} | {int(sum(r['dropped'].values()))} |"
        )
    rows.append(
        f"\nLargest K bridged with every datagram received, nothing dropped and the loop under "
        f"{SUSTAINED_CPU_SHARE:.0%} of one core: **{max(ok, default=0)}**. "
        f"Load average at the end {load[0]:.2f} (shared 2-core machine: other engineers' "
        "builds and benchmarks ran at the same time)."
    )
    rows.append(NOTES)
    record("chat", doc, "\n".join(rows) + "\n")


NOTES = """
Latency is measured from the moment the chat tap takes a decrypted frame (inside the UDP
endpoint's `datagram_received`) to the moment the peer process reads it from its WebSocket:
the queue hand-off to the link's writer task, framing (16-byte header), the WebSocket send and
the loopback TCP hop. It does not include the device→gateway UDP hop, which the bridge does not
change. CPU is the gateway process only; compare with bench/results/scale.md (same traffic,
not bridged) for what bridging costs.

On a shared machine (see the load average above) the gateway, the peer and the sender each get
a slice of the two cores: when the gateway process gets ~20 % of a core while K sessions need
more, the kernel drops the datagrams it could not read in time ("received" < "sent") and the
latency includes the time the gateway or the peer waited to be scheduled. Those rows measure
the machine; the CPU per bridged audio second is the figure that carries over (the sessions per
core column divides one core by it).

Where the gateway's time goes (cProfile of the gateway process at 50 sessions, same run
conditions): the WebSocket `send()` syscall per frame is the largest single item (~2 s of
~15 s busy, ~240 µs a call: on loopback the kernel delivers to the peer process inside the
sender's `send()`), then Opus decode, the UDP path and the VAD. One WebSocket per session
(issue 11) means one send per frame — frames of one session arrive 60 ms apart, so there is
nothing to coalesce; against an upstream on another host the send costs a NIC transmit instead.
"""


async def main_async() -> list[dict[str, Any]]:
    runs = []
    for k in SIZES:
        with tempfile.TemporaryDirectory(prefix="snlpgw-chat-") as tmp:
            run = await run_size(k, Path(tmp))
        sys.stderr.write(json.dumps(run) + "\n")
        runs.append(run)
    return runs


def main() -> int:
    runs = asyncio.run(main_async())
    write_results(runs, os.getloadavg())
    return 0


if __name__ == "__main__":
    sys.exit(main())
