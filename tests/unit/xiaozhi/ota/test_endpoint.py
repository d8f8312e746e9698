"""The OTA HTTP shell with a fake provisioner (aiohttp's in-process test server): trust book
verdicts mapped to HTTP, bindings persisted, rate limits, the dedicated executor, approvals."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.http import RouteHandler
from gateway.metrics import Metrics
from gateway.openapi import RouteDoc
from gateway.settings import Settings
from gateway.xiaozhi.ota.admin import OtaAdmin
from gateway.xiaozhi.ota.endpoint import OtaEndpoint
from gateway.xiaozhi.ota.provisioning import Provisioner
from gateway.xiaozhi.stats import ChannelStats
from gateway.xiaozhi.status import StatusBook
from gateway.xiaozhi.status_admin import StatusAdmin
from tests.unit.xiaozhi.fakes import sample

MAC = "24:0a:c4:12:34:56"
DEV = "24_0a_c4_12_34_56"
BOARD_UUID = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
SPOOF_UUID = "9b2c6a2e-1111-4222-8333-444455556666"
HEADERS = {
    "Device-Id": MAC,
    "Client-Id": BOARD_UUID,
    "User-Agent": "bread-compact-wifi/2.4.2",
    "Activation-Version": "1",
}
SPOOFED = {**HEADERS, "Client-Id": SPOOF_UUID}


class FakeProvisioner:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def __call__(self, dev: str, password: str) -> None:
        self.calls.append((dev, password, threading.current_thread().name))


def settings_for(tmp_path: Path, **xiaozhi: Any) -> Settings:
    return Settings(mqtt={"url": "mqtt://10.1.2.3:1883"}, data_dir=tmp_path, xiaozhi=xiaozhi)


class OtaRig:
    def __init__(
        self, client: TestClient, endpoint: OtaEndpoint, metrics: Metrics, status: StatusBook
    ) -> None:
        self.client, self.endpoint, self.metrics = client, endpoint, metrics
        self.status = status

    async def ota(self, headers: dict[str, str], **kw: Any) -> tuple[int, dict[str, Any]]:
        resp = await self.client.post("/xiaozhi/ota/", headers=headers, **kw)
        return resp.status, await resp.json()

    async def activate(self, headers: dict[str, str], body: Any = None) -> int:
        resp = await self.client.post("/xiaozhi/ota/activate", headers=headers, json=body or {})
        return resp.status

    async def approve(self, code: str) -> tuple[int, dict[str, Any]]:
        resp = await self.client.post("/admin/devices/approve", json={"code": code})
        return resp.status, await resp.json()

    def metric(self, name: str, **labels: str) -> float:
        return sample(self.metrics, name, **labels)


@dataclass
class Routes:
    """The route table edge: the endpoints register themselves on a plain aiohttp app."""

    app: web.Application

    def add_route(
        self, method: str, path: str, handler: RouteHandler, doc: RouteDoc | None = None
    ) -> None:
        self.app.router.add_route(method, path, handler)


async def start(
    settings: Settings, provision: Provisioner | None, revoked: list[str] | None = None
) -> AsyncIterator[OtaRig]:
    metrics = Metrics()
    app = web.Application()
    endpoint = OtaEndpoint(
        settings=settings,
        provision=provision,
        revoke=None if revoked is None else revoked.append,
        stats=ChannelStats(metrics),
        http=Routes(app),
    )
    status = StatusBook(max_devices=8)
    OtaAdmin(endpoint, admin=Routes(app), forgotten=status.forget)
    StatusAdmin(status, admin=Routes(app))
    try:
        async with TestClient(TestServer(app)) as client:
            yield OtaRig(client, endpoint, metrics, status)
    finally:
        endpoint.close()


@pytest.fixture
def fake() -> FakeProvisioner:
    return FakeProvisioner()


@pytest.fixture
async def rig(tmp_path: Path, fake: FakeProvisioner) -> AsyncIterator[OtaRig]:
    async for r in start(settings_for(tmp_path), fake):
        yield r


async def test_first_contact_binds_and_the_same_password_is_served_again(
    rig: OtaRig, fake: FakeProvisioner, tmp_path: Path
) -> None:
    status, first = await rig.ota(HEADERS, json={"mac_address": MAC})
    assert status == 200
    second = await (await rig.client.get("/xiaozhi/ota/", headers=HEADERS)).json()
    assert first["mqtt"]["password"] == second["mqtt"]["password"]  # nothing rotated
    assert first["mqtt"]["client_id"] == f"GID_bread-compact-wifi@@@{DEV}@@@{BOARD_UUID}"
    assert first["mqtt"]["endpoint"] == "10.1.2.3:1883"
    assert "activation" not in first
    password = first["mqtt"]["password"]
    assert [c[:2] for c in fake.calls] == [(DEV, password), (DEV, password)]
    assert all(c[2].startswith("snlpgw-ota") for c in fake.calls)  # the OTA executor
    stored = json.loads((tmp_path / "xiaozhi" / "bindings.json").read_text())
    assert stored["devices"][DEV] == {"client_id": BOARD_UUID, "generation": 1, "serial": None}
    assert (tmp_path / "xiaozhi" / "bindings.json").stat().st_mode & 0o777 == 0o600
    assert password not in json.dumps(stored)


async def test_bindings_survive_a_restart(tmp_path: Path, fake: FakeProvisioner) -> None:
    async for rig in start(settings_for(tmp_path), fake):
        _, first = await rig.ota(HEADERS)
    async for rig in start(settings_for(tmp_path), fake):
        _, again = await rig.ota(HEADERS)
        assert again["mqtt"]["password"] == first["mqtt"]["password"]
        _, spoofed = await rig.ota(SPOOFED)
        assert "mqtt" not in spoofed
        assert set(spoofed["activation"]) == {"message", "code", "challenge", "timeout_ms"}


async def test_spoofed_client_gets_an_activation_and_approval_moves_the_binding(
    rig: OtaRig, fake: FakeProvisioner
) -> None:
    _, real = await rig.ota(HEADERS)
    _, spoofed = await rig.ota(SPOOFED)
    code = spoofed["activation"]["code"]
    assert len(code) == 6
    assert code.isdigit()
    assert spoofed["activation"]["timeout_ms"] == 600_000
    assert len(fake.calls) == 1  # the activation reached no provisioner
    assert await rig.activate(SPOOFED) == 202
    pending = await (await rig.client.get("/admin/devices/pending")).json()
    assert [(p["code"], p["device"]) for p in pending["pending"]] == [(code, DEV)]
    assert await rig.approve("000000" if code != "000000" else "000001") == (
        404,
        {"error": "unknown", "detail": "no such code"},
    )
    status, approved = await rig.approve(code)
    assert (status, approved["device"], approved["client_id"]) == (200, DEV, SPOOF_UUID)
    assert await rig.activate(SPOOFED) == 200
    _, now_bound = await rig.ota(SPOOFED)
    assert now_bound["mqtt"]["password"] != real["mqtt"]["password"]  # generation 2
    _, old = await rig.ota(HEADERS)
    assert "activation" in old
    devices = await (await rig.client.get("/admin/devices")).json()
    assert devices["devices"][DEV]["generation"] == 2
    assert rig.metric("xiaozhi_ota_approvals_total", outcome="approved") == 1
    assert rig.metric("xiaozhi_ota_activations_total", outcome="activate_done") == 1


async def test_rotate_gives_the_bound_board_its_next_password(rig: OtaRig) -> None:
    _, before = await rig.ota(HEADERS)
    resp = await rig.client.post(f"/admin/devices/{DEV}/rotate")
    assert (resp.status, await resp.json()) == (200, {"device": DEV, "generation": 2})
    _, after = await rig.ota(HEADERS)
    assert after["mqtt"]["password"] != before["mqtt"]["password"]
    assert (await rig.client.post("/admin/devices/aa_bb_cc_dd_ee_ff/rotate")).status == 404
    assert (await rig.client.post("/admin/devices/nope/rotate")).status == 400


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b'{"code": 123456}',
        b'{"code": "12345"}',
        b"[]",
        b"[" * 1000 + b"]" * 1000,  # was a RecursionError: 500
        b'{"code": "\\ud800"}',
    ],
)
async def test_malformed_approvals_are_400(rig: OtaRig, body: bytes) -> None:
    resp = await rig.client.post("/admin/devices/approve", data=body)
    assert resp.status == 400
    assert (await resp.json())["error"] == "bad_request"


async def test_wrong_codes_lock_approval(rig: OtaRig) -> None:
    await rig.ota(HEADERS)
    _, spoofed = await rig.ota(SPOOFED)
    code = spoofed["activation"]["code"]
    wrong = [f"{n:06d}" for n in range(12) if f"{n:06d}" != code][:11]
    statuses = [(await rig.approve(c))[0] for c in wrong]
    assert statuses == [404] * 10 + [429]
    assert (await rig.approve(code))[0] == 429


@pytest.mark.parametrize(
    ("provision", "status", "message"),
    [
        (None, 503, "not configured"),
        (lambda dev, pw: (_ for _ in ()).throw(OSError("disk full")), 500, "provisioning failed"),
    ],
)
async def test_provisioning_failures_are_clear_errors(
    tmp_path: Path, provision: Provisioner | None, status: int, message: str
) -> None:
    async for rig in start(settings_for(tmp_path), provision):
        code, body = await rig.ota(HEADERS)
        assert code == status
        assert message in body["error"]
        assert "mqtt" not in body
        assert rig.metric("xiaozhi_ota_requests_total", status=str(status)) == 1


async def test_refused_requests_never_reach_the_provisioner(
    rig: OtaRig, fake: FakeProvisioner
) -> None:
    assert (await rig.ota(HEADERS, json={"mac_address": "24:0a:c4:99:99:99"}))[0] == 400
    assert (await rig.ota({**HEADERS, "Device-Id": "nope"}))[0] == 400
    assert (await rig.ota({**HEADERS, "Client-Id": "not-a-uuid"}))[0] == 400
    resp = await rig.client.post("/xiaozhi/ota/activate", headers=HEADERS, data=b"[1]")
    assert resp.status == 400
    assert fake.calls == []


async def test_rate_limits_answer_429_with_retry_after(
    tmp_path: Path, fake: FakeProvisioner
) -> None:
    settings = settings_for(tmp_path, ota_mac_burst=2, ota_ip_burst=4)
    async for rig in start(settings, fake):
        assert [(await rig.ota(HEADERS))[0] for _ in range(3)] == [200, 200, 429]
        resp = await rig.client.post(
            "/xiaozhi/ota/", headers={**HEADERS, "Device-Id": "24:0a:c4:00:00:01"}
        )
        assert resp.status == 200
        resp = await rig.client.post(
            "/xiaozhi/ota/activate", headers={**HEADERS, "Device-Id": "24:0a:c4:00:00:02"}
        )
        assert (resp.status, resp.headers["Retry-After"]) == (429, "30")
        assert rig.metric("xiaozhi_ota_refused_total", reason="rate_mac") == 1
        assert rig.metric("xiaozhi_ota_refused_total", reason="rate_ip") == 1
        assert len(fake.calls) == 3


async def test_requests_beyond_the_inflight_bound_get_503(tmp_path: Path) -> None:
    release, entered = threading.Event(), threading.Event()

    def slow(dev: str, password: str) -> None:
        entered.set()
        release.wait(10)

    async for rig in start(settings_for(tmp_path, ota_max_inflight=1), slow):
        first = asyncio.ensure_future(rig.ota(HEADERS))
        await asyncio.to_thread(entered.wait, 10)
        status, body = await rig.ota(HEADERS)
        assert (status, body) == (503, {"error": "busy"})
        release.set()
        assert (await first)[0] == 200


async def test_allowlist_policy_refuses_unlisted_macs(
    tmp_path: Path, fake: FakeProvisioner
) -> None:
    allow = tmp_path / "allow.txt"
    allow.write_text(f"# boards we sold\n{MAC}  # bedroom\n\n")
    settings = settings_for(tmp_path, ota_policy="allowlist", ota_allowlist_file=allow)
    async for rig in start(settings, fake):
        assert (await rig.ota(HEADERS))[0] == 200
        status, body = await rig.ota({**HEADERS, "Device-Id": "24:0a:c4:00:00:09"})
        assert (status, body) == (403, {"error": "not_allowlisted"})
    assert len(fake.calls) == 1


async def test_forget_unbinds_and_revokes_the_broker_user(
    tmp_path: Path, fake: FakeProvisioner
) -> None:
    revoked: list[str] = []
    async for rig in start(settings_for(tmp_path), fake, revoked):
        await rig.ota(HEADERS)
        resp = await rig.client.delete(f"/admin/devices/{DEV}")
        assert (resp.status, await resp.json()) == (200, {"device": DEV, "forgotten": True})
        assert revoked == [DEV]
        assert (await rig.client.delete(f"/admin/devices/{DEV}")).status == 404
        assert (await rig.client.delete("/admin/devices/nope")).status == 400
        _, spoofed = await rig.ota(SPOOFED)  # a first contact again: credentials
        assert "mqtt" in spoofed
        stored = json.loads((tmp_path / "xiaozhi" / "bindings.json").read_text())
        assert stored["devices"][DEV]["client_id"] == SPOOF_UUID


async def test_status_route_serves_the_device_record_and_forgets_it_with_the_device(
    tmp_path: Path, fake: FakeProvisioner
) -> None:
    async for rig in start(settings_for(tmp_path), fake, []):
        assert (await rig.client.get(f"/admin/devices/{DEV}/status")).status == 404
        assert (await rig.client.get("/admin/devices/nope/status")).status == 400
        rig.status.hello(DEV, {"mcp": True}, 1700000000.0)
        tools = [{"name": "self.reboot", "description": "Reboot", "inputSchema": {}}]
        rig.status.mcp_answer(DEV, {"id": 2, "result": {"tools": tools}}, 1700000001.0)
        resp = await rig.client.get(f"/admin/devices/{DEV}/status")
        assert (resp.status, await resp.json()) == (
            200,
            {
                "device": DEV,
                "features": {"mcp": True},
                "hello_at": 1700000000.0,
                "mcp": {
                    "tools": [{"name": "self.reboot", "description": "Reboot", "params": []}],
                    "seen_at": 1700000001.0,
                    "complete": True,
                    "cut": {"tools": 0, "text": 0},
                    "bytes": len(b'{"name":"self.reboot","description":"Reboot","params":[]}'),
                },
            },
        )
        await rig.ota(HEADERS)  # bound, then unbound: its status goes with it
        assert (await rig.client.delete(f"/admin/devices/{DEV}")).status == 200
        assert (await rig.client.get(f"/admin/devices/{DEV}/status")).status == 404
