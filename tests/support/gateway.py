"""Run a real gateway ``Service`` in-process against a test broker."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from gateway.service import Component, Service
from gateway.settings import Settings, load_settings, merge_sections
from tests.support.broker import Broker


def gateway_settings(broker: Broker, data_dir: Path, **overrides: Any) -> Settings:
    """Settings for a test gateway: ephemeral ports, its own id and data dir, fast metrics."""
    base: dict[str, Any] = {
        "gateway_id": f"gw-{uuid.uuid4().hex[:8]}",
        "data_dir": data_dir,
        "mqtt": {
            "url": broker.url,
            "password": broker.gateway_credentials().password,
            "reconnect_min_s": 0.05,
            "reconnect_max_s": 0.5,
        },
        "http": {"port": 0, "admin_port": 0},
        "udp": {"port": 0},
        "ops": {"metrics_interval_s": 0.2, "shutdown_timeout_s": 2.0},
    }
    return load_settings(**merge_sections(base, overrides))


@contextlib.asynccontextmanager
async def running(
    settings: Settings, components: Sequence[Component] = (), *, service: Service | None = None
) -> AsyncIterator[Service]:
    """Start the service, wait until it is connected and serving; stop it cleanly after."""
    svc = service or Service(settings, components)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(svc.serve(until=stop), name="test.gateway")
        try:
            async with asyncio.timeout(10):
                await svc.mqtt.wait_connected()
                await svc.http.wait_started()
                await svc.admin.wait_started()
            yield svc
        finally:
            stop.set()
            async with asyncio.timeout(settings.ops.shutdown_timeout_s + 2):
                await task
