"""The gateway's HTTP servers (aiohttp), embedded in the service TaskGroup.

The service runs two of them: the **device listener** (``http.host:port``) that boards reach,
serving OTA and ``GET /healthz`` only, and the **admin listener** (``http.admin_host:admin_port``,
loopback by default) serving ``GET /metrics`` (Prometheus text), ``/healthz``, the task API and
device approval; with ``http.admin_token`` set, every admin route but ``/healthz`` requires
``Authorization: Bearer <token>`` (compared in constant time, never logged).
Components add their routes through :meth:`HttpServer.add_route` before the servers start.
aiohttp's ``AppRunner`` is used rather than ``web.run_app`` so the server installs no signal
handlers and stops under the service's shutdown budget.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web

from gateway.metrics import Metrics
from gateway.openapi import RouteDoc

log = logging.getLogger(__name__)

RouteHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]
HealthCheck = Callable[[], dict[str, object]]


class RouteTable(Protocol):
    """Where a component serves its routes (:class:`HttpServer`; a plain aiohttp router in
    shell tests)."""

    def add_route(
        self, method: str, path: str, handler: RouteHandler, doc: RouteDoc | None = None
    ) -> None: ...


_MAX_BODY = 64 * 1024  # OTA bodies are a few KiB of system info; nothing we serve takes more
_OPEN_PATHS = frozenset({"/healthz"})  # answered without the admin token (liveness probes)


_HEALTHZ = RouteDoc(
    summary="Liveness and readiness: 200 when every component is ready, else 503",
    tag="operations",
    errors=(503,),
)
_METRICS = RouteDoc(
    summary="Prometheus text exposition of every gateway metric",
    tag="operations",
    content_type="text/plain",
)


class HttpServer:
    def __init__(
        self,
        *,
        host: str,
        port: int,
        metrics: Metrics,
        name: str = "http",
        serve_metrics: bool = True,
        token: str | None = None,
        health: dict[str, HealthCheck] | None = None,
        health_details: bool = True,
    ) -> None:
        """``health``: share another server's checks (the admin listener shows the same
        /healthz as the device listener); ``health_details``: False answers only ``{"ok"}``
        (the device listener: boards need no view of the gateway's insides); ``token``:
        require it as a bearer token."""
        self._health_details = health_details
        self._host = host
        self._port = port
        self._metrics = metrics
        self._name = name
        self._token = token.encode() if token else None
        middlewares = [self._auth] if self._token is not None else []
        self._app = web.Application(client_max_size=_MAX_BODY, middlewares=middlewares)
        self._health: dict[str, HealthCheck] = {} if health is None else health
        self._bound_port: int | None = None
        self._started = asyncio.Event()
        self.route_docs: dict[tuple[str, str], RouteDoc] = {}
        self.add_route("GET", "/healthz", self._healthz, _HEALTHZ)
        if serve_metrics:
            self.add_route("GET", "/metrics", self._metrics_text, _METRICS)

    def add_route(
        self, method: str, path: str, handler: RouteHandler, doc: RouteDoc | None = None
    ) -> None:
        """Serve ``handler``; ``doc`` describes it in the OpenAPI document (every admin route
        must have one: ``tests/unit/test_openapi.py``)."""
        self._app.router.add_route(method, path, handler)
        if doc is not None:
            self.route_docs[(method.upper(), path)] = doc

    @property
    def routes(self) -> list[tuple[str, str]]:
        """(method, path) of every route served (HEAD twins of GET left out)."""
        found = []
        for route in self._app.router.routes():
            info = route.resource.get_info() if route.resource is not None else {}
            path = str(info.get("path") or info.get("formatter") or "")
            if route.method != "HEAD":
                found.append((route.method, path))
        return found

    def on_shutdown(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the server starts shutting down, before it waits for the
        handlers still running: long-lived answers (server-sent events) end there."""

        async def run(_: web.Application) -> None:
            callback()

        self._app.on_shutdown.append(run)

    def add_health(self, name: str, check: HealthCheck) -> None:
        """A component's health detail; ``ok: false`` in any detail makes /healthz answer 503."""
        self._health[name] = check

    @property
    def health_checks(self) -> dict[str, HealthCheck]:
        return self._health

    @property
    def port(self) -> int:
        if self._bound_port is None:
            raise RuntimeError(f"{self._name} server not started")
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
            addresses = runner.addresses
            self._bound_port = int(addresses[0][1]) if addresses else self._port
            self._started.set()
            log.info("%s listening on %s:%d", self._name, self._host, self._bound_port)
            await asyncio.Event().wait()  # serve until cancelled
        finally:
            await runner.cleanup()

    @web.middleware
    async def _auth(self, request: web.Request, handler: RouteHandler) -> web.StreamResponse:
        if request.path in _OPEN_PATHS or not self._needs_bearer(request):
            return await handler(request)
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        expected = self._token or b""
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), expected):
            return web.json_response(
                {"error": "unauthorized", "detail": "admin routes need a bearer token"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer realm="snlpgw-admin"'},
            )
        return await handler(request)

    def _needs_bearer(self, request: web.Request) -> bool:
        """False only for a route documented ``bearer=False`` (it checks a signature itself)."""
        info = request.match_info.route.resource
        template = info.canonical if info is not None else ""
        doc = self.route_docs.get((request.method, template))
        return doc is None or doc.bearer

    async def _healthz(self, _: web.Request) -> web.Response:
        details = {name: check() for name, check in self._health.items()}
        ok = all(d.get("ok", True) for d in details.values())
        body = {"ok": ok, **details} if self._health_details else {"ok": ok}
        return web.json_response(body, status=200 if ok else 503)

    async def _metrics_text(self, _: web.Request) -> web.Response:
        body = self._metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})
