from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from gateway.http import HttpServer
from gateway.metrics import Metrics
from gateway.openapi import RouteDoc


@pytest.fixture
async def server() -> AsyncIterator[HttpServer]:
    metrics = Metrics()
    metrics.counter("probe", "a probe counter").inc(2)
    srv = HttpServer(host="127.0.0.1", port=0, metrics=metrics)
    state = {"ok": True}
    srv.add_health("component", lambda: {"ok": state["ok"], "sessions": 3})

    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"path": request.path})

    async def body_len(request: web.Request) -> web.Response:
        return web.json_response({"len": len(await request.read())})

    srv.add_route("GET", "/echo", echo)
    srv.add_route("POST", "/body", body_len)
    srv.state = state  # type: ignore[attr-defined]
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(srv.run(), name="test.http")
        await srv.wait_started()
        yield srv
        task.cancel()


async def test_healthz_reports_components_and_503_when_unhealthy(server: HttpServer) -> None:
    url = f"http://127.0.0.1:{server.port}/healthz"
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as resp:
            assert resp.status == 200
            assert await resp.json() == {"ok": True, "component": {"ok": True, "sessions": 3}}
        server.state["ok"] = False  # type: ignore[attr-defined]
        async with http.get(url) as resp:
            assert resp.status == 503
            assert (await resp.json())["ok"] is False


async def test_metrics_in_prometheus_text(server: HttpServer) -> None:
    url = f"http://127.0.0.1:{server.port}/metrics"
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        assert "snlpgw_probe_total 2.0" in await resp.text()


async def test_component_routes_and_oversized_bodies(server: HttpServer) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{server.port}/echo") as resp:
            assert await resp.json() == {"path": "/echo"}
        async with http.post(f"http://127.0.0.1:{server.port}/echo", data=b"x" * 10) as resp:
            assert resp.status == 405
        async with http.post(f"http://127.0.0.1:{server.port}/body", data=b"x" * 1000) as resp:
            assert await resp.json() == {"len": 1000}
        async with http.post(f"http://127.0.0.1:{server.port}/body", data=b"x" * 70_000) as resp:
            assert resp.status == 413


def test_port_before_start_is_an_error() -> None:
    srv = HttpServer(host="127.0.0.1", port=0, metrics=Metrics())
    with pytest.raises(RuntimeError, match="not started"):
        _ = srv.port


async def test_only_routes_documented_without_bearer_skip_the_admin_token() -> None:
    """Attack: with the admin token set, ask every route without it, including one that checks a signature itself.
    Defence: only the route documented ``bearer=False`` answers (its own check decides); the others answer 401."""
    srv = HttpServer(host="127.0.0.1", port=0, metrics=Metrics(), token="s3cret")

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"id": request.match_info.get("id", "")})

    srv.add_route("GET", "/admin/things/{id}", ok, RouteDoc(summary="a", tag="t"))
    srv.add_route("GET", "/admin/signed/{id}", ok, RouteDoc(summary="b", tag="t", bearer=False))
    srv.add_route("GET", "/admin/undocumented", ok)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(srv.run(), name="test.http")
        await srv.wait_started()
        base = f"http://127.0.0.1:{srv.port}"
        async with aiohttp.ClientSession() as http:
            for path in ("/admin/things/1", "/admin/undocumented", "/admin/nowhere", "/metrics"):
                async with http.get(base + path) as resp:
                    assert resp.status == 401, path
            async with http.get(base + "/admin/signed/7") as resp:
                assert resp.status == 200
                assert await resp.json() == {"id": "7"}
            async with http.post(base + "/admin/signed/7") as resp:
                assert resp.status == 401  # the exemption is per method and path
            auth = {"Authorization": "Bearer s3cret"}
            async with http.get(base + "/admin/things/1", headers=auth) as resp:
                assert resp.status == 200
        task.cancel()
