"""The gateway's HTTP server (aiohttp), embedded in the service TaskGroup.

Built-in routes: ``GET /healthz`` and ``GET /metrics`` (Prometheus text). Components add their
own routes (OTA, task API) through :meth:`HttpServer.add_route` before the server starts.
aiohttp's ``AppRunner`` is used rather than ``web.run_app`` so the server installs no signal
handlers and stops under the service's shutdown budget.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.metrics import Metrics

log = logging.getLogger(__name__)

RouteHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]
HealthCheck = Callable[[], dict[str, object]]

_MAX_BODY = 64 * 1024  # OTA bodies are a few KiB of system info; nothing we serve takes more


class HttpServer:
    def __init__(self, *, host: str, port: int, metrics: Metrics) -> None:
        self._host = host
        self._port = port
        self._metrics = metrics
        self._app = web.Application(client_max_size=_MAX_BODY)
        self._health: dict[str, HealthCheck] = {}
        self._bound_port: int | None = None
        self._started = asyncio.Event()
        self._app.router.add_get("/healthz", self._healthz)
        self._app.router.add_get("/metrics", self._metrics_text)

    def add_route(self, method: str, path: str, handler: RouteHandler) -> None:
        self._app.router.add_route(method, path, handler)

    def add_health(self, name: str, check: HealthCheck) -> None:
        """A component's health detail; ``ok: false`` in any detail makes /healthz answer 503."""
        self._health[name] = check

    @property
    def port(self) -> int:
        if self._bound_port is None:
            raise RuntimeError("HTTP server not started")
        return self._bound_port

    async def wait_started(self) -> None:
        await self._started.wait()

    async def run(self) -> None:
        runner = web.AppRunner(
            self._app, access_log=None, handle_signals=False, shutdown_timeout=1.0
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._host, self._port)
            await site.start()
            server = site._server  # aiohttp exposes no public accessor for the bound port
            sockets = getattr(server, "sockets", None) or []
            self._bound_port = sockets[0].getsockname()[1] if sockets else self._port
            self._started.set()
            log.info("HTTP listening on %s:%d", self._host, self._bound_port)
            await asyncio.Event().wait()  # serve until cancelled
        finally:
            await runner.cleanup()

    async def _healthz(self, _: web.Request) -> web.Response:
        details = {name: check() for name, check in self._health.items()}
        ok = all(d.get("ok", True) for d in details.values())
        return web.json_response({"ok": ok, **details}, status=200 if ok else 503)

    async def _metrics_text(self, _: web.Request) -> web.Response:
        body = self._metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})
