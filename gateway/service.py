"""The service: one TaskGroup owning the broker connection, the HTTP servers, the metrics
publisher and every component (channels, runtime, assessment, store).

The shared :class:`Context` is built first (:meth:`Context.create`: the MQTT connection exists
before it connects, so routes can be registered at once). Each component is then built ONCE with
what it needs, registering its MQTT routes, HTTP routes and health checks in its constructor,
and does its long-running work in ``run``, which the service owns and cancels at shutdown.
Components reach each other only through what they are given at construction (see
``gateway.app`` and docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gateway.broker.credentials import gateway_secret
from gateway.gcwatch import GcWatch, freeze_startup_heap, set_thresholds
from gateway.http import HttpServer
from gateway.metrics import Metrics
from gateway.mqtt.connection import MqttConnection
from gateway.mqtt.edge import gateway_client_id, presence_payload
from gateway.mqtt.tls import broker_context
from gateway.ops_snapshot import capped_snapshot
from gateway.settings import Settings
from topics import OpsEvent, TopicKind, build_topic, encode

log = logging.getLogger(__name__)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Ops:
    """Publishes ops alarms on ``snlpgw/v1/ops/{gw}/events`` (QoS 1) and counts them."""

    gateway_id: str
    mqtt: MqttConnection
    metrics: Metrics
    # Told (alarm, device, epoch ms) of each alarm raised, on the loop (the console's fleet).
    listeners: list[Callable[[str, str | None, int], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._alarms = self.metrics.counter("ops_alarms", "Ops alarms raised", ["alarm"])

    def alarm(self, alarm: str, *, device: str | None = None, **detail: object) -> None:
        self._alarms.labels(alarm).inc()
        try:
            body = OpsEvent(
                gateway_id=self.gateway_id,
                ts=_now_ms(),
                alarm=alarm,
                device=device,
                detail=json.loads(json.dumps(detail, default=str)),
            )
        except ValueError:
            log.exception("alarm %r does not fit the ops contract", alarm)
            return
        self.mqtt.publish(
            build_topic(TopicKind.OPS_EVENTS, gw=self.gateway_id), encode(body), qos=1
        )
        for listener in self.listeners:
            try:
                listener(alarm, device, body.ts)
            except Exception:
                log.exception("ops alarm listener failed")


@dataclass(frozen=True)
class Context:
    """What a component may use; built once, before any component (:meth:`create`)."""

    settings: Settings
    mqtt: MqttConnection
    http: HttpServer  # device-facing: OTA and /healthz only
    metrics: Metrics
    ops: Ops
    admin: HttpServer  # loopback admin listener: metrics, task API, approvals

    @classmethod
    def create(cls, settings: Settings) -> Context:
        """The broker connection (not yet connected), both HTTP servers (not yet listening),
        the metrics registry and the ops alarm publisher for ``settings``."""
        metrics = Metrics()
        gw = settings.gateway_id
        # TLS files are read at each connect; one unusable now stops the start (TlsSetupError,
        # an OSError `snlpgw run` reports) instead of failing every reconnect.
        broker_context(settings.mqtt)
        secret = gateway_secret(settings)
        password = secret.password
        if password is None:  # `snlpgw run` refuses a configured password_file it cannot read
            log.warning("no gateway password (%s); connecting without one", secret.problem)
        mqtt = MqttConnection(
            settings=settings.mqtt,
            password=password,
            client_id=gateway_client_id(gw, password),
            presence_topic=build_topic(TopicKind.GW_STATUS, gw=gw),
            presence_payload=presence_payload(gw),
            metrics=metrics,
            alarm=lambda alarm, **detail: ops.alarm(alarm, **detail),  # noqa: PLW0108 - ops is built next, with mqtt
        )
        ops = Ops(gw, mqtt, metrics)
        http = HttpServer(
            host=settings.http.host,
            port=settings.http.port,
            metrics=metrics,
            name="HTTP (devices)",
            serve_metrics=False,
            health_details=False,
        )
        token = settings.http.admin_token
        admin = HttpServer(
            host=settings.http.admin_host,
            port=settings.http.admin_port,
            metrics=metrics,
            name="HTTP (admin)",
            token=token.get_secret_value() if token is not None else None,
            health=http.health_checks,
        )
        http.add_health("mqtt", mqtt.health)
        return cls(settings, mqtt, http, metrics, ops, admin)


class Component(Protocol):
    """A long-running part of the service, already built with everything it uses."""

    name: str

    async def run(self) -> None: ...


class Service:
    """Runs the context's servers and the components; builds nothing of theirs."""

    def __init__(self, ctx: Context, components: Sequence[Component] = ()) -> None:
        self.ctx = ctx
        self.settings = ctx.settings
        self.metrics = ctx.metrics
        self.mqtt = ctx.mqtt
        self.http = ctx.http
        self.admin = ctx.admin
        self.ops = ctx.ops
        self.components = list(components)
        self._started_mono = time.monotonic()
        self._uptime = self.metrics.gauge("uptime_seconds", "Seconds since the service started")
        self._snapshots = self.metrics.counter("metrics_snapshots", "Metrics snapshots published")
        self._gc = GcWatch(self.metrics)
        self._snapshot_dropped = self.metrics.counter(
            "metrics_snapshot_series_dropped",
            "Series left out of retained snapshots to stay under ops.snapshot_max_bytes",
        )

    async def run(self) -> None:
        """Run everything until cancelled."""
        thresholds = set_thresholds(self.settings.ops.gc_thresholds)
        if thresholds is None:
            log.warning("incremental garbage collector: ops.gc_thresholds not applied")
        else:
            log.info("garbage collector thresholds %s", thresholds)
        if self.settings.ops.gc_freeze:
            frozen = freeze_startup_heap()
            log.info("start-up heap frozen out of the garbage collector (%d objects)", frozen)
        self._gc.install()
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.mqtt.run(), name="service.mqtt")
                tg.create_task(self.http.run(), name="service.http")
                tg.create_task(self.admin.run(), name="service.admin-http")
                tg.create_task(self._publish_metrics(), name="service.metrics")
                for component in self.components:
                    tg.create_task(component.run(), name=f"service.{component.name}")
        finally:
            self._gc.uninstall()

    async def serve(self, until: asyncio.Event) -> None:
        """Run until ``until`` is set, then shut down within the configured budget."""
        budget = self.settings.ops.shutdown_timeout_s
        async with asyncio.TaskGroup() as tg:
            runner = tg.create_task(self.run(), name="service")
            stop = tg.create_task(until.wait(), name="service.stop-signal")
            await asyncio.wait({runner, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not runner.done():
                log.info("shutting down (budget %.1fs)", budget)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(budget / 2):
                        await self.mqtt.close(grace_s=budget / 2)
                runner.cancel()
            stop.cancel()
        log.info("stopped")

    async def _publish_metrics(self) -> None:
        gw = self.settings.gateway_id
        interval = self.settings.ops.metrics_interval_s
        await self.mqtt.wait_connected()
        while True:
            self._uptime.set(time.monotonic() - self._started_mono)
            self._snapshots.inc()
            body, dropped = capped_snapshot(
                self.metrics.snapshot(),
                gateway_id=gw,
                ts=_now_ms(),
                interval_s=interval,
                max_bytes=self.settings.ops.snapshot_max_bytes,
            )
            if dropped:
                self._snapshot_dropped.inc(dropped)
                log.warning("metrics snapshot over its cap: %d series left out", dropped)
            self.mqtt.publish(build_topic(TopicKind.OPS_METRICS, gw=gw), body, qos=0, retain=True)
            await asyncio.sleep(interval)
