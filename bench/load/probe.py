"""The broker's own share of the latency: a client on the harness's side publishes to itself
every ``PERIOD_S`` (QoS 0, a topic nobody else reads) and notes each round trip with when it
left. A broker that stops delivering for a while (Mosquitto writes its persistence file in its
one thread, see ``autosave_interval`` in mosquitto/README.md) shows as a long round trip here
and as a late PLAY_MEDIA at every board at that moment, while the gateway's own timer lateness
stays small.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import AsyncIterator

from gateway import mqtt_codec as codec
from gateway.mqtt_client import Client
from gateway.mqtt_options import ClientOptions

PERIOD_S = 0.02
TOPIC = "snlpgw/v1/loadprobe"
PROBE_USER = "load-probe"  # provisioned with the gateway's role: the only one that may loop


async def broker_probe(host: str, port: int, password: str, out: list[tuple[float, float]]) -> None:
    """Until cancelled: ``out`` gets (sent at, round trip ms), monotonic seconds."""

    def echo(message: codec.PublishPacket) -> None:
        (sent,) = struct.unpack("!d", message.payload)
        out.append((sent, (time.monotonic() - sent) * 1000))

    options = ClientOptions(client_id=PROBE_USER, username=PROBE_USER, password=password,
                            version=codec.V311)  # fmt: skip
    client = Client(options, echo)
    await client.connect(host, port, wait_s=30)
    try:
        await client.subscribe([(TOPIC, 0)])
        while True:
            client.publish(TOPIC, struct.pack("!d", time.monotonic()), qos=0)
            await asyncio.sleep(PERIOD_S)
    finally:
        client.abort()


@contextlib.asynccontextmanager
async def probing(host: str, port: int, password: str) -> AsyncIterator[list[tuple[float, float]]]:
    """The probe's samples while the block runs; a probe that failed fails the block."""
    samples: list[tuple[float, float]] = []
    task = asyncio.create_task(broker_probe(host, port, password, samples), name="load.probe")
    try:
        yield samples
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def stalls(samples: list[tuple[float, float]], t0: float, over_ms: float = 30.0) -> list[str]:
    """Round trips over ``over_ms`` as "+S s: R ms" (S from ``t0``), longest first, at most
    10, one per second (the probes sent during one stall all come back late)."""
    picked: list[tuple[float, float]] = []
    for at, rtt in sorted(samples, key=lambda s: -s[1]):
        if rtt <= over_ms or len(picked) == 10:
            break
        if all(abs(at - other) > 1.0 for other, _ in picked):
            picked.append((at, rtt))
    return [f"+{at - t0:.1f} s: {rtt:.0f} ms" for at, rtt in picked]
