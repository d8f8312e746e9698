"""The dev stack's gateway: one settings builder and one in-process runner.

:func:`gateway_sections` / :func:`gateway_settings` are the settings of every gateway the demo,
the tests and the benchmarks start: the given broker, ephemeral loopback HTTP/admin/UDP ports,
the repo's catalog, plus the tuning of its use (:class:`Use`). :func:`start_service` serves a
built :class:`~gateway.service.Service` in a task group and returns once it is connected and
listening (and whatever else ``ready`` waits for); :func:`serving` and :func:`running_gateway`
(the production composition, :func:`gateway.app.build_gateway`) wrap it for an ``async with``.
Nothing here touches the user's ``.data`` or the default ports 1883/8003/8004.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from devstack.broker import Broker, StackError
from gateway.app import Gateway, build_gateway
from gateway.assessment.engine import Backend
from gateway.service import Service
from gateway.settings import Settings, load_settings, merge_sections

REPO_ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 20.0
Ready = Callable[[], Awaitable[None]]


class Use(Enum):
    """What a gateway is started for; each use has its own tuning on top of the common base."""

    TEST = "test"  # fast reconnects and metrics, short shutdown: tests wait on them
    DEMO = "demo"  # the defaults, a short shutdown
    LOAD = "load"  # benchmarks: no ASR, rare metrics, quiet logs (they would skew the numbers)


_TUNING: dict[Use, dict[str, dict[str, Any]]] = {
    Use.TEST: {
        "mqtt": {"reconnect_min_s": 0.05, "reconnect_max_s": 0.5},
        # gc_freeze off: a test process runs many gateways; one freezing the heap would keep
        # every later test's cycles it holds (test_service checks the freeze itself). The
        # collector's thresholds are the process's too: left as pytest has them.
        "ops": {
            "metrics_interval_s": 0.2,
            "shutdown_timeout_s": 2.0,
            "gc_freeze": False,
            "gc_thresholds": None,
        },
        # No phrase preparation: ~140 espeak-ng runs at every test gateway's start would cost
        # the suite minutes of CPU; the tests of it turn it on.
        "speech": {"presynth": False},
        # No voice overload: the test gateway shares its loop with the test's simulators on a
        # CI machine that may be busy, and a test of what decoding finds must not see its
        # window captured instead; the tests of voice overload set it themselves.
        "xiaozhi": {"overload_lag_ms": 0},
        # No catch-up assessment: a test of what was shed must find it still shed; the tests of
        # catch-up set an interval themselves.
        "asr": {"catch_up_interval_s": 0},
    },
    # The demo's gateway shares its process with the simulators and lives for one lesson:
    # nothing to gain from a frozen heap, and the test that runs the demo must not leave one.
    Use.DEMO: {"ops": {"shutdown_timeout_s": 3.0, "gc_freeze": False, "gc_thresholds": None}},
    Use.LOAD: {
        # No catch-up either: the benchmarks measure what is assessed live.
        "asr": {"engine": "none", "catch_up_interval_s": 0},
        "ops": {"metrics_interval_s": 60.0, "log_level": "WARNING", "shutdown_timeout_s": 5.0},
    },
}


def gateway_sections(
    broker: Broker,
    data_dir: Path | None = None,
    *,
    use: Use = Use.TEST,
    **overrides: Any,
) -> dict[str, Any]:
    """The settings as plain sections (JSON-able: a gateway process reads them from a file).

    ``data_dir`` defaults to the broker's (where its broker files and the gateway's password
    are); ``overrides``: top-level values or sections merged field by field over the rest."""
    base: dict[str, Any] = {
        "gateway_id": f"gw-{secrets.token_hex(4)}",
        "data_dir": str(data_dir or broker.data_dir),
        "mqtt": {"url": broker.url, "password": broker.gateway_credentials().password},
        "http": {"host": "127.0.0.1", "port": 0, "admin_port": 0, "console_port": 0},
        "udp": {"host": "127.0.0.1", "port": 0},
        "runtime": {
            "catalog_path": str(REPO_ROOT / "catalog"),
            "resource_dir": str(REPO_ROOT / "catalog" / "resources"),
        },
    }
    return merge_sections(merge_sections(base, _TUNING[use]), overrides)


def gateway_settings(
    broker: Broker, data_dir: Path | None = None, *, use: Use = Use.TEST, **overrides: Any
) -> Settings:
    """:func:`gateway_sections`, built (``SNLPGW_*`` variables still apply under them)."""
    return load_settings(**gateway_sections(broker, data_dir, use=use, **overrides))


@dataclass
class ServiceRun:
    """A service serving in a task group; :meth:`stop` ends it (gracefully, or killed)."""

    service: Service
    task: asyncio.Task[None]
    _stop: asyncio.Event

    async def stop(self, *, kill: bool = False) -> None:
        """Graceful stop (the shutdown path, bounded by ``ops.shutdown_timeout_s``), or
        ``kill``: cancel the service at once, as a crash would."""
        if kill:
            self.task.cancel()
        else:
            self._stop.set()
        budget = self.service.settings.ops.shutdown_timeout_s + 5.0
        done, _ = await asyncio.wait({self.task}, timeout=budget)
        if not done:
            self.task.cancel()
            raise StackError(f"the gateway did not stop within {budget:.0f}s")


async def start_service(
    service: Service,
    tg: asyncio.TaskGroup,
    *,
    ready: Sequence[Ready] = (),
    timeout_s: float = READY_TIMEOUT_S,
) -> ServiceRun:
    """Serve ``service`` in ``tg``; returns once its MQTT connection is up, both HTTP listeners
    serve and every ``ready`` wait returned. A crash of the service fails ``tg``."""
    stop = asyncio.Event()
    task = tg.create_task(service.serve(until=stop), name="devstack.gateway")
    run = ServiceRun(service, task, stop)
    try:
        async with asyncio.timeout(timeout_s):
            await service.mqtt.wait_connected()
            await service.http.wait_started()
            await service.admin.wait_started()
            for wait in ready:
                await wait()
    except BaseException:
        task.cancel()
        raise
    return run


@contextlib.asynccontextmanager
async def serving(service: Service, *, ready: Sequence[Ready] = ()) -> AsyncIterator[Service]:
    """``service`` serving until the block exits, then a graceful, bounded shutdown."""
    async with asyncio.TaskGroup() as tg:
        run = await start_service(service, tg, ready=ready)
        try:
            yield service
        finally:
            await run.stop()


def gateway_ready(gw: Gateway) -> tuple[Ready, ...]:
    """What the composed gateway waits for past the service: UDP bound, tasks restored, the
    console listening (when enabled)."""
    console = (gw.console.server.wait_started,) if gw.console is not None else ()
    return (gw.xiaozhi.wait_ready, gw.tasks.wait_ready, *console)


@contextlib.asynccontextmanager
async def running_gateway(
    settings: Settings, *, asr_backend: Backend | None = None
) -> AsyncIterator[Gateway]:
    """The production composition serving until the block exits; ``asr_backend`` replaces the
    configured ASR engine (tests)."""
    gw = build_gateway(settings, asr_backend=asr_backend)
    async with serving(gw.service, ready=gateway_ready(gw)):
        yield gw
