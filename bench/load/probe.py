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
from dataclasses import dataclass, field

from gateway.mqtt import codec
from gateway.mqtt.client import Client
from gateway.mqtt.options import ClientOptions, MqttError

PERIOD_S = 0.02
TOPIC = "snlpgw/v1/loadprobe"
PROBE_USER = "load-probe"  # provisioned with the gateway's role: the only one that may loop


@dataclass
class BrokerProbe:
    """What the probe saw: (sent at, round trip ms), monotonic seconds; why it stopped early."""

    samples: list[tuple[float, float]] = field(default_factory=list)
    error: str | None = None


async def broker_probe(host: str, port: int, password: str, probe: BrokerProbe) -> None:
    """Until cancelled: round trips into ``probe``. A connection that fails or drops ends it
    with ``probe.error`` set (the run goes on; the report says the figure is cut short)."""
    out = probe.samples

    def echo(message: codec.PublishPacket) -> None:
        (sent,) = struct.unpack("!d", message.payload)
        out.append((sent, (time.monotonic() - sent) * 1000))

    options = ClientOptions(client_id=PROBE_USER, username=PROBE_USER, password=password,
                            version=codec.V311)  # fmt: skip
    client = Client(options, echo)
    try:
        await client.connect(host, port, wait_s=30)
        await client.subscribe([(TOPIC, 0)])
        while True:
            client.publish(TOPIC, struct.pack("!d", time.monotonic()), qos=0)
            await asyncio.sleep(PERIOD_S)
    except MqttError as exc:
        probe.error = str(exc)
    finally:
        client.abort()


@contextlib.asynccontextmanager
async def probing(host: str, port: int, password: str) -> AsyncIterator[BrokerProbe]:
    """The probe running while the block runs; never raises into it (see :class:`BrokerProbe`)."""
    probe = BrokerProbe()
    task = asyncio.create_task(broker_probe(host, port, password, probe), name="load.probe")
    try:
        yield probe
    finally:
        task.cancel()
        (result,) = await asyncio.gather(task, return_exceptions=True)
        if isinstance(result, Exception) and probe.error is None:
            probe.error = repr(result)  # not the connection's: a bug, said, never raised here


def stalls(samples: list[tuple[float, float]], t0: float, over_ms: float = 30.0) -> list[str]:
    """Round trips over ``over_ms`` as "S s: R ms" (S seconds from ``t0``), longest first, at
    most 10, one per second (the probes sent during one stall all come back late)."""
    picked: list[tuple[float, float]] = []
    for at, rtt in sorted(samples, key=lambda s: -s[1]):
        if rtt <= over_ms or len(picked) == 10:
            break
        if all(abs(at - other) > 1.0 for other, _ in picked):
            picked.append((at, rtt))
    return [f"{at - t0:.1f} s: {rtt:.0f} ms" for at, rtt in picked]
