"""`snlpgw device …` as an operator runs it, against a running gateway's admin listener; and
the `make run` path: the channel's own provisioner, default policy `bind`, a board's first
contact gets working credentials."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from gateway.mqtt.probe import await_login, connack
from gateway.simulators.xiaozhi import ActivationRequired, XiaozhiDeviceSim
from tests.integration.xiaozhi_support import XiaozhiGateway, new_mac, running_gateway
from tests.support.broker import Broker

# Hang guards, not timings: each `snlpgw device` run starts a Python process that imports the
# gateway; on two cores shared with a CPU hog one took ~20 s, and this test runs several.
CLI_S = 120.0
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
TOKEN = "cli-admin-token"


async def cli(gw: XiaozhiGateway, *args: str, token: str = TOKEN) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNLPGW_")}
    env["SNLPGW_HTTP__ADMIN_TOKEN"] = token
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "device", "--admin-url", gw.admin_url, *args,
        cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(CLI_S):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_first_contact_provisions_and_the_cli_approves_a_new_client_id(
    broker: Broker,
) -> None:
    async with running_gateway(
        broker, production_provisioner=True, http={"admin_token": TOKEN}
    ) as gw:
        mac = new_mac()
        first = await XiaozhiDeviceSim(mac=mac).provision(gw.ota_url)  # `make run` default
        assert connack(broker.host, broker.port, first.username, first.password) == 0
        replaced = XiaozhiDeviceSim(mac=mac)
        with pytest.raises(ActivationRequired) as asked:
            await replaced.provision(gw.ota_url)
        code = asked.value.activation["code"]

        status, out, _ = await cli(gw, "pending")
        assert status == 0
        assert code in [p["code"] for p in json.loads(out)["pending"]]
        status, _, err = await cli(gw, "approve", code, token="wrong")
        assert (status, "answered 401" in err) == (1, True)
        status, out, _ = await cli(gw, "approve", code)
        assert (status, json.loads(out)["client_id"]) == (0, replaced.uuid)
        assert await replaced.activate(gw.ota_url) == 200
        info = await replaced.provision(gw.ota_url)
        assert connack(broker.host, broker.port, info.username, info.password) == 0
        status, out, _ = await cli(gw, "list")
        assert json.loads(out)["devices"][info.username]["generation"] == 2
        status, out, _ = await cli(gw, "rotate", info.username)
        assert (status, json.loads(out)["generation"]) == (0, 3)
        assert (await cli(gw, "approve", "12345"))[0] == 1  # malformed: 400
        status, out, _ = await cli(gw, "forget", info.username)
        assert (status, json.loads(out)["forgotten"]) == (0, True)
        # The broker drops the user on its reload, a moment after the signal: wait for it.
        refused = await asyncio.to_thread(
            await_login, broker.host, broker.port, info.username, info.password,
            accepted=False, within_s=10,
        )  # fmt: skip
        assert refused == 135
    status, _, err = await cli(gw, "list")
    assert status == 2
    assert "cannot reach" in err
