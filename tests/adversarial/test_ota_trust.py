"""OTA trust on a real gateway and a real Mosquitto: spoofed Device-Id, floods of new MACs,
activation code guessing, the allowlist, and HMAC (Activation-Version 2) challenges."""

from __future__ import annotations

import json
import secrets
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.mqtt.probe import connack
from gateway.simulators.xiaozhi import ActivationRequired, XiaozhiDeviceSim
from tests.integration.xiaozhi_support import XiaozhiGateway, new_mac, running_gateway
from tests.support.broker import Broker

pytestmark = pytest.mark.integration

TOKEN = "ota-admin-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NOT_AUTHORIZED = 135


def broker_users(broker: Broker) -> set[str]:
    doc = json.loads((broker.data_dir / "mosquitto" / "users.json").read_text())
    return set(doc["users"])


def accepts(broker: Broker, username: str, password: str) -> bool:
    return connack(broker.host, broker.port, username, password) == 0


async def admin(gw: XiaozhiGateway, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, gw.admin_url + path, headers=AUTH, json=body) as resp,
    ):
        return resp.status, await resp.json()


async def ota_post(gw: XiaozhiGateway, mac: str) -> tuple[int, Any]:
    """One OTA request the way a script would send it (a fresh Client-Id)."""
    headers = {"Device-Id": mac, "Client-Id": str(uuid.uuid4())}
    async with (
        aiohttp.ClientSession() as http,
        http.post(gw.ota_url, headers=headers, json={}) as resp,
    ):
        return resp.status, await resp.json()


async def test_spoofed_device_id_gets_an_activation_and_the_real_board_keeps_working(
    broker: Broker,
) -> None:
    """Attack: an attacker POSTs OTA with a real board's MAC as Device-Id and its own Client-Id, then polls /activate.
    Defence: it gets only an `activation` code (no credentials, nothing rotated, no broker reload); the real board stays connected, re-provisions to the same password and keeps talking."""
    async with running_gateway(broker, http={"admin_token": TOKEN}) as gw:
        mac = new_mac()
        board = XiaozhiDeviceSim(mac=mac)
        info = await board.provision(gw.ota_url)
        passwd = broker.data_dir / "mosquitto" / "passwd"
        before = passwd.stat()
        async with board:
            await board.open_audio_channel()
            attacker = XiaozhiDeviceSim(mac=mac)
            with pytest.raises(ActivationRequired) as asked:
                await attacker.provision(gw.ota_url)
            assert set(asked.value.activation) == {"message", "code", "challenge", "timeout_ms"}
            assert attacker.mqtt_info is None
            assert await attacker.activate(gw.ota_url) == 202
            assert (await board.provision(gw.ota_url)).password == info.password  # reboot
            after = passwd.stat()
            assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
            assert accepts(broker, info.username, info.password)
            hello = await board.open_audio_channel()  # the live connection was never dropped
            assert hello.session_id
        assert gw.metric("xiaozhi_ota_activations_total", outcome="issued") == 1
        assert gw.metric("xiaozhi_ota_requests_total", status="200") == 3


async def test_an_approved_new_client_id_locks_out_the_previous_one(broker: Broker) -> None:
    """Attack: a board's credentials leaked with its old Client-Id; after a factory reset the owner approves the board's new Client-Id.
    Defence: approval moves the binding to the next password generation, so the old password is refused by the broker and the old Client-Id only gets an activation."""
    async with running_gateway(broker, http={"admin_token": TOKEN}) as gw:
        mac = new_mac()
        old = await XiaozhiDeviceSim(mac=mac).provision(gw.ota_url)
        reset = XiaozhiDeviceSim(mac=mac)
        with pytest.raises(ActivationRequired) as asked:
            await reset.provision(gw.ota_url)
        status, body = await admin(
            gw, "POST", "/admin/devices/approve", {"code": asked.value.activation["code"]}
        )
        assert (status, body["client_id"]) == (200, reset.uuid)
        assert await reset.activate(gw.ota_url) == 200
        new = await reset.provision(gw.ota_url)
        assert new.password != old.password
        assert accepts(broker, new.username, new.password)
        assert connack(broker.host, broker.port, old.username, old.password) == (NOT_AUTHORIZED)


async def test_a_flood_of_new_macs_is_capped_per_hour(broker: Broker) -> None:
    """Attack: one host POSTs OTA for 40 random MACs to mint broker users.
    Defence: only `xiaozhi.ota_users_per_hour` (here 5) users are created; the other 35 get 429 `user_cap`, counted, with no user and no binding."""
    async with running_gateway(broker, ota_users_per_hour=5, ota_ip_burst=1000) as gw:
        users_before = broker_users(broker)
        macs = [new_mac() for _ in range(40)]
        statuses = [(await ota_post(gw, mac))[0] for mac in macs]
        assert statuses.count(200) == 5
        assert statuses.count(429) == 35
        created = broker_users(broker) - users_before
        assert created == {
            m.replace(":", "_") for m, s in zip(macs, statuses, strict=True) if s == 200
        }
        assert gw.metric("xiaozhi_ota_refused_total", reason="user_cap") == 35


async def test_one_host_is_rate_limited(broker: Broker) -> None:
    """Attack: one host sends 100 OTA requests as fast as it can, each for a new MAC.
    Defence: its per-IP token bucket (burst `xiaozhi.ota_ip_burst`, here 10) passes 10; the other 90 get 429 `rate_ip` before any file is touched."""
    async with running_gateway(broker, ota_ip_burst=10, ota_ip_per_min=1) as gw:
        users_before = broker_users(broker)
        statuses = [(await ota_post(gw, new_mac()))[0] for _ in range(100)]
        assert statuses.count(200) == 10
        assert statuses.count(429) == 90
        assert len(broker_users(broker) - users_before) == 10
        assert gw.metric("xiaozhi_ota_refused_total", reason="rate_ip") == 90


async def test_activation_codes_cannot_be_brute_forced(broker: Broker) -> None:
    """Attack: with a pending activation for a spoofed MAC, the attacker tries code after code on the approval API.
    Defence: after 10 wrong codes approvals lock (429), the right code included, and the binding stays with the real board."""
    async with running_gateway(broker, http={"admin_token": TOKEN}) as gw:
        mac = new_mac()
        board = XiaozhiDeviceSim(mac=mac)
        info = await board.provision(gw.ota_url)
        attacker = XiaozhiDeviceSim(mac=mac)
        with pytest.raises(ActivationRequired) as asked:
            await attacker.provision(gw.ota_url)
        code = asked.value.activation["code"]
        guesses = [f"{n:06d}" for n in range(20) if f"{n:06d}" != code][:15]
        statuses = [
            (await admin(gw, "POST", "/admin/devices/approve", {"code": g}))[0] for g in guesses
        ]
        assert statuses == [404] * 10 + [429] * 5
        assert (await admin(gw, "POST", "/admin/devices/approve", {"code": code}))[0] == 429
        assert await attacker.activate(gw.ota_url) == 202
        _, devices = await admin(gw, "GET", "/admin/devices")
        assert devices["devices"][mac.replace(":", "_")]["client_id"] == board.uuid
        assert (await board.provision(gw.ota_url)).password == info.password
        assert gw.metric("xiaozhi_ota_approvals_total", outcome="locked") == 6


async def test_allowlist_refuses_unknown_macs(broker: Broker, tmp_path: Path) -> None:
    """Attack: a board the operator never listed asks OTA for credentials under policy `allowlist`.
    Defence: 403 `not_allowlisted`, no broker user, no binding; a listed board is provisioned and connects."""
    listed = new_mac()
    allow = tmp_path / "allowlist.txt"
    allow.write_text(f"# our boards\n{listed}\n")
    async with running_gateway(broker, ota_policy="allowlist", ota_allowlist_file=allow) as gw:
        users_before = broker_users(broker)
        stranger = new_mac()
        assert await ota_post(gw, stranger) == (403, {"error": "not_allowlisted"})
        assert stranger.replace(":", "_") not in broker_users(broker)
        sim = XiaozhiDeviceSim(mac=listed)
        info = await sim.provision(gw.ota_url)
        async with sim:
            assert (await sim.open_audio_channel()).session_id
        assert broker_users(broker) - users_before == {info.username}
        assert gw.metric("xiaozhi_ota_refused_total", reason="not_allowlisted") == 1


def _keys_file(tmp_path: Path, serial: str, key: bytes) -> Path:
    path = tmp_path / "hmac-keys.json"
    path.write_text(json.dumps({serial: key.hex()}))
    return path


async def test_hmac_v2_board_with_its_key_activates_itself(broker: Broker, tmp_path: Path) -> None:
    """Attack: none (the positive case): a board with an efuse serial and HMAC key contacts OTA for the first time.
    Defence: it is challenged, answers with HMAC-SHA256(key, challenge), is bound without a human and connects."""
    serial, key = "SN" + secrets.token_hex(8), secrets.token_bytes(32)
    keys = _keys_file(tmp_path, serial, key)
    async with running_gateway(broker, ota_hmac_keys_file=keys) as gw:
        board = XiaozhiDeviceSim(mac=new_mac(), serial=serial, hmac_key=key)
        with pytest.raises(ActivationRequired):
            await board.provision(gw.ota_url)
        assert await board.activate(gw.ota_url) == 200
        info = await board.provision(gw.ota_url)
        async with board:
            assert (await board.open_audio_channel()).session_id
        assert accepts(broker, info.username, info.password)


async def test_hmac_v2_wrong_key_is_refused(broker: Broker, tmp_path: Path) -> None:
    """Attack: a board claims a provisioned serial number but signs the challenge with a wrong key (or replays a signature of another challenge).
    Defence: /activate answers 403, nothing is bound, and OTA keeps answering with an activation only."""
    serial, key = "SN" + secrets.token_hex(8), secrets.token_bytes(32)
    keys = _keys_file(tmp_path, serial, key)
    async with running_gateway(broker, ota_hmac_keys_file=keys) as gw:
        mac = new_mac()
        forger = XiaozhiDeviceSim(mac=mac, serial=serial, hmac_key=secrets.token_bytes(32))
        with pytest.raises(ActivationRequired):
            await forger.provision(gw.ota_url)
        assert await forger.activate(gw.ota_url) == 403
        assert await forger.activate(gw.ota_url, signature="00" * 32) == 403
        with pytest.raises(ActivationRequired):
            await forger.provision(gw.ota_url)
        assert mac.replace(":", "_") not in broker_users(broker)
        assert gw.metric("xiaozhi_ota_activations_total", outcome="activate_bad_hmac") == 2


async def test_a_spoofer_cannot_drain_the_real_boards_rate_limit(broker: Broker) -> None:
    """Attack: an attacker hammers OTA with a real board's MAC (and its own Client-Id) until it is rate limited, hoping the board's next boot gets 429.
    Defence: the per-device bucket is keyed by MAC and Client-Id: the attacker hits 429 `rate_mac`, the real board is answered with its credentials."""
    async with running_gateway(broker, ota_ip_burst=1000) as gw:
        mac = new_mac()
        board = XiaozhiDeviceSim(mac=mac)
        info = await board.provision(gw.ota_url)
        attacker = XiaozhiDeviceSim(mac=mac).ota_headers()
        statuses = []
        async with aiohttp.ClientSession() as http:
            for _ in range(20):
                async with http.post(gw.ota_url, headers=attacker, json={}) as resp:
                    statuses.append(resp.status)
        assert statuses == [200] * 15 + [429] * 5  # burst 15: activations, then 429
        assert (await board.provision(gw.ota_url)).password == info.password
        assert gw.metric("xiaozhi_ota_refused_total", reason="rate_mac") == 5
