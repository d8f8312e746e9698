"""Admin surface: metrics, the task API and device approval live on the admin listener only,
behind the bearer token; the device-facing listener answers OTA and /healthz, nothing else."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from devstack.gateway import gateway_settings, serving
from gateway.app import build_gateway
from gateway.service import Service
from tests.support.broker import Broker

pytestmark = pytest.mark.integration

TOKEN = "adm-7b2f0c-test-token-not-a-real-secret"
ADMIN_ROUTES = (
    ("GET", "/metrics"),
    ("GET", "/task/instance"),
    ("GET", "/task/instance/inst-1"),
    ("GET", "/admin/devices/pending"),
    ("GET", "/admin/devices/aa_bb_cc_dd_ee_ff/status"),
    ("POST", "/admin/devices/approve"),
)


@pytest.fixture
async def gateway(broker: Broker, tmp_path: Path) -> AsyncIterator[Service]:
    settings = gateway_settings(
        broker,
        tmp_path / "data",
        asr={"engine": "none"},
        http={"admin_token": TOKEN},
    )
    gw = build_gateway(settings)
    async with serving(gw.service) as svc:
        yield svc


async def _status(method: str, url: str, headers: dict[str, str] | None = None) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, url, headers=headers or {}, json={}) as resp,
    ):
        return resp.status


async def test_admin_routes_do_not_exist_on_the_device_port(gateway: Service) -> None:
    """Attack: a device (or anyone who can reach OTA) asks the device port for /metrics, the task API and the approval API, with and without the admin token, and reads /healthz.
    Defence: the device listener has no such routes: every one answers 404; only OTA and a bare `{"ok": …}` /healthz are served there (component details only on the admin listener)."""
    device = f"http://127.0.0.1:{gateway.http.port}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for method, path in ADMIN_ROUTES:
        assert await _status(method, device + path) == 404, path
        assert await _status(method, device + path, auth) == 404, path
    async with aiohttp.ClientSession() as http:
        async with http.get(device + "/healthz") as resp:
            assert (resp.status, await resp.json()) == (200, {"ok": True})
        admin = f"http://127.0.0.1:{gateway.admin.port}/healthz"
        async with http.get(admin) as resp:
            assert {"ok", "mqtt", "store", "xiaozhi"} <= set(await resp.json())
    assert gateway.admin.port != gateway.http.port


async def test_admin_routes_need_the_bearer_token(
    gateway: Service, caplog: pytest.LogCaptureFixture
) -> None:
    """Attack: a local process calls the admin listener without a token, with a wrong one, with a near-miss and with the right token under another scheme.
    Defence: every admin route answers 401 (the token is compared in constant time and never logged); only the exact bearer token gets through."""
    caplog.set_level(logging.DEBUG)
    admin = f"http://127.0.0.1:{gateway.admin.port}"
    wrong = (
        {},
        {"Authorization": "Bearer nope"},
        {"Authorization": f"Bearer {TOKEN[:-1]}"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
    )
    for method, path in ADMIN_ROUTES:
        for headers in wrong:
            assert await _status(method, admin + path, headers) == 401, (path, headers)
    ok = {"Authorization": f"Bearer {TOKEN}"}
    assert await _status("GET", admin + "/metrics", ok) == 200
    assert await _status("GET", admin + "/task/instance", ok) == 200
    assert await _status("GET", admin + "/healthz") == 200  # liveness stays open
    assert TOKEN not in caplog.text
