"""A real gateway (service + Xiaozhi channel) on the harness broker, for the Xiaozhi tests.

Everything is real: the service's MQTT connection, the aiohttp server on a free port, the UDP
endpoint on a free port, credentials written by ``gateway.broker.credentials`` with a broker reload.
The recorders turn the channel's callbacks into awaitable conditions (bounded waits only).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from devstack.gateway import Use, gateway_settings, serving
from gateway.service import Context, Service
from gateway.settings import Settings
from gateway.simulators.xiaozhi import XiaozhiDeviceSim
from gateway.xiaozhi.channel import XiaozhiChannel
from gateway.xiaozhi.ota.provisioning import broker_provisioner
from tests.support.broker import Broker


@dataclass(frozen=True)
class HeardUtterance:
    dev: str
    session_id: str
    start_ms: float
    end_ms: float
    pcm_bytes: int


class VoiceRecorder:
    """VoiceSink + SessionEvents that tests can await."""

    def __init__(self) -> None:
        self.started: list[tuple[str, float]] = []
        self.utterances: list[HeardUtterance] = []
        self.events: list[tuple[Any, ...]] = []
        self._changed = asyncio.Event()

    # VoiceSink
    def speech_started(self, dev: str, session_id: str, at_ms: float) -> None:
        self.started.append((dev, at_ms))
        self._bump()

    def speech_stopped(
        self,
        dev: str,
        session_id: str,
        pcm: bytes,
        start_ms: float,
        end_ms: float,
        *,
        packets: Sequence[bytes] = (),
    ) -> None:
        self.utterances.append(HeardUtterance(dev, session_id, start_ms, end_ms, len(pcm)))
        self._bump()

    # SessionEvents
    def session_opened(self, dev: str, session_id: str, channel: object) -> None:
        self.events.append(("opened", dev, session_id))
        self._bump()

    def session_closed(self, dev: str, session_id: str, reason: str) -> None:
        self.events.append(("closed", dev, session_id, reason))
        self._bump()

    def listen(
        self, dev: str, session_id: str, state: str, mode: str | None, text: str | None
    ) -> None:
        self.events.append(("listen", dev, state, mode))
        self._bump()

    def abort(self, dev: str, session_id: str, reason: str | None) -> None:
        self.events.append(("abort", dev, reason))
        self._bump()

    def mcp_message(self, dev: str, payload: Mapping[str, Any]) -> None:
        self.events.append(("mcp", dev, dict(payload)))
        self._bump()

    def utterances_of(self, dev: str) -> list[HeardUtterance]:
        return [u for u in self.utterances if u.dev == dev]

    async def wait_for(self, condition: Callable[[], bool], *, timeout_s: float = 20.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not condition():
                self._changed.clear()
                await self._changed.wait()

    def _bump(self) -> None:
        self._changed.set()


@dataclass
class XiaozhiGateway:
    service: Service
    channel: XiaozhiChannel
    recorder: VoiceRecorder
    settings: Settings
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ota_url(self) -> str:
        return f"http://127.0.0.1:{self.service.http.port}/xiaozhi/ota/"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.service.admin.port}"

    def metric(self, name: str, **labels: str) -> float:
        value = self.service.metrics.registry.get_sample_value(f"snlpgw_{name}", labels)
        return 0.0 if value is None else value


# Tests stream up to 10x real time (the pipeline takes stream time from sequence numbers, not
# arrival); the production per-session datagram budget (40/s) is for real-time devices.
FAST_STREAM_PPS = 1000.0


def recorded_channel(
    broker: Broker, ctx: Context, *, production_provisioner: bool = False, **options: Any
) -> tuple[XiaozhiChannel, VoiceRecorder]:
    """The Xiaozhi channel on ``ctx`` with a :class:`VoiceRecorder` for its voice and task events,
    provisioning through the harness's hook (reloads ``broker``) unless
    ``production_provisioner``; ``options``: more of the channel's keyword arguments
    (``udp_rate_pps`` defaults to :data:`FAST_STREAM_PPS`)."""
    settings = ctx.settings
    recorder = VoiceRecorder()
    channel = XiaozhiChannel(
        settings=settings,
        mqtt=ctx.mqtt,
        metrics=ctx.metrics,
        http=ctx.http,
        admin=ctx.admin,
        voice=recorder,
        events=recorder,
        provision=None
        if production_provisioner
        else broker_provisioner(settings, reload=broker.reload),
        **{"udp_rate_pps": FAST_STREAM_PPS, **options},
    )
    return channel, recorder


@asynccontextmanager
async def running_gateway(
    broker: Broker,
    *,
    udp_rate_pps: float = FAST_STREAM_PPS,
    production_provisioner: bool = False,
    http: dict[str, Any] | None = None,
    use: Use = Use.TEST,
    udp_coalesce_s: float | None = None,
    **xiaozhi: Any,
) -> AsyncIterator[XiaozhiGateway]:
    """``production_provisioner``: the channel's own default (broker files under data_dir,
    reload through the broker's pid file) instead of the harness's reload hook; ``http``:
    settings of the HTTP listeners (e.g. ``admin_token``); ``use``: the dev stack's tuning
    (benchmarks pass ``Use.LOAD``); ``udp_coalesce_s``: the UDP endpoint's read coalescing
    (default: the production one); ``xiaozhi``: that section."""
    settings = gateway_settings(broker, use=use, http=http or {}, xiaozhi=xiaozhi)
    ctx = Context.create(settings)
    options: dict[str, Any] = {"udp_rate_pps": udp_rate_pps}
    if udp_coalesce_s is not None:
        options["udp_coalesce_s"] = udp_coalesce_s
    channel, recorder = recorded_channel(
        broker, ctx, production_provisioner=production_provisioner, **options
    )
    service = Service(ctx, [channel])
    async with serving(service, ready=(channel.wait_ready,)):
        yield XiaozhiGateway(service, channel, recorder, settings)


def new_mac() -> str:
    """A random locally administered unicast MAC, colon form (the OTA ``Device-Id``)."""
    octets = bytearray(secrets.token_bytes(6))
    octets[0] = (octets[0] | 0x02) & 0xFE
    return ":".join(f"{b:02x}" for b in octets)


@asynccontextmanager
async def provisioned_device(gw: XiaozhiGateway) -> AsyncIterator[tuple[str, XiaozhiDeviceSim]]:
    """A new device simulator, provisioned over OTA and connected: ``(device id, simulator)``."""
    mac = new_mac()
    sim = XiaozhiDeviceSim(mac=mac)
    await sim.provision(gw.ota_url)
    async with sim:
        yield mac.replace(":", "_"), sim
