"""The OTA HTTP handler with a fake provisioner (aiohttp's in-process test server)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.metrics import Metrics
from gateway.settings import Settings
from gateway.xiaozhi.ota import OtaEndpoint, Provisioner
from gateway.xiaozhi.stats import ChannelStats
from tests.unit.xiaozhi.fakes import sample

MAC = "24:0a:c4:12:34:56"
DEV = "24_0a_c4_12_34_56"
HEADERS = {
    "Device-Id": MAC,
    "Client-Id": "3f2504e0-4f89-41d3-9a0c-0305e82c3301",
    "User-Agent": "bread-compact-wifi/2.4.2",
    "Activation-Version": "2",
}


@dataclass(frozen=True)
class Creds:
    username: str
    password: str | None


class FakeProvisioner:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, dev: str) -> Creds:
        self.calls.append(dev)
        return Creds(dev, f"pw-{len(self.calls)}")


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


async def client_for(provision: Provisioner | None, metrics: Metrics) -> TestClient:
    app = web.Application()
    endpoint = OtaEndpoint(
        settings=Settings(mqtt={"url": "mqtt://10.1.2.3:1883"}),
        provision=provision,
        stats=ChannelStats(metrics),
    )
    app.router.add_route("POST", "/xiaozhi/ota/", endpoint.handle)
    app.router.add_route("GET", "/xiaozhi/ota/", endpoint.handle)
    return TestClient(TestServer(app))


@pytest.fixture
def fake() -> FakeProvisioner:
    return FakeProvisioner()


async def test_provisions_the_header_device_and_rotates_each_time(
    fake: FakeProvisioner, metrics: Metrics
) -> None:
    async with await client_for(fake, metrics) as client:
        first = await (
            await client.post("/xiaozhi/ota/", headers=HEADERS, json={"mac_address": MAC})
        ).json()
        second = await (await client.get("/xiaozhi/ota/", headers=HEADERS)).json()
    assert fake.calls == [DEV, DEV]
    assert first["mqtt"]["password"] == "pw-1"
    assert second["mqtt"]["password"] == "pw-2"
    assert first["mqtt"]["client_id"] == f"GID_bread-compact-wifi@@@{DEV}@@@{HEADERS['Client-Id']}"
    assert first["mqtt"]["endpoint"] == "10.1.2.3:1883"
    assert "activation" not in first
    assert sample(metrics, "xiaozhi_ota_requests_total", status="200") == 2


@pytest.mark.parametrize(
    ("provision", "status", "message"),
    [
        (None, 503, "not configured"),
        (lambda dev: (_ for _ in ()).throw(OSError("disk full")), 500, "provisioning failed"),
        (lambda dev: Creds(dev, None), 500, "provisioning failed"),
        (lambda dev: Creds("someone_else", "pw"), 500, "provisioning failed"),
    ],
)
async def test_provisioning_failures_are_clear_errors(
    provision: Provisioner | None, status: int, message: str, metrics: Metrics
) -> None:
    async with await client_for(provision, metrics) as client:
        resp = await client.post("/xiaozhi/ota/", headers=HEADERS)
        body = await resp.json()
    assert resp.status == status
    assert message in body["error"]
    assert "mqtt" not in body
    assert sample(metrics, "xiaozhi_ota_requests_total", status=str(status)) == 1


async def test_refused_requests_never_reach_the_provisioner(
    fake: FakeProvisioner, metrics: Metrics
) -> None:
    async with await client_for(fake, metrics) as client:
        other = {"mac_address": "24:0a:c4:99:99:99"}
        resp = await client.post("/xiaozhi/ota/", headers=HEADERS, json=other)
        assert resp.status == 400
        resp = await client.post("/xiaozhi/ota/", headers={**HEADERS, "Device-Id": "nope"})
        assert resp.status == 400
    assert fake.calls == []
