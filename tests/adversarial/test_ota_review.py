"""OTA trust attacks found in review: an HMAC key of one serial used for another serial's
binding, and a forgotten MAC's next binding handing out the previous holder's password."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from gateway.mqtt.probe import connack
from gateway.simulators.xiaozhi import ActivationRequired, XiaozhiDeviceSim
from tests.adversarial.test_ota_trust import NOT_AUTHORIZED, TOKEN, accepts, admin, broker_users
from tests.integration.xiaozhi_support import new_mac, running_gateway
from tests.support.broker import Broker

pytestmark = pytest.mark.integration


async def test_hmac_key_of_one_serial_cannot_activate_another_serials_board(
    broker: Broker, tmp_path: Path
) -> None:
    """Attack: an attacker holding the HMAC key of its own provisioned board asks OTA with a victim's MAC and serial, then answers /activate naming its own serial and signing with its own key.
    Defence: the signature is checked against the key of the serial the challenge was issued for: /activate answers 403, the victim keeps its binding and password, the attacker gets no credentials."""
    victim_serial, victim_key = "SN" + secrets.token_hex(8), secrets.token_bytes(32)
    own_serial, own_key = "SN" + secrets.token_hex(8), secrets.token_bytes(32)
    keys = tmp_path / "hmac-keys.json"
    keys.write_text(json.dumps({victim_serial: victim_key.hex(), own_serial: own_key.hex()}))
    async with running_gateway(broker, ota_hmac_keys_file=keys) as gw:
        mac = new_mac()
        victim = XiaozhiDeviceSim(mac=mac, serial=victim_serial, hmac_key=victim_key)
        with pytest.raises(ActivationRequired):
            await victim.provision(gw.ota_url)
        assert await victim.activate(gw.ota_url) == 200
        info = await victim.provision(gw.ota_url)

        attacker = XiaozhiDeviceSim(mac=mac, serial=victim_serial)
        with pytest.raises(ActivationRequired):
            await attacker.provision(gw.ota_url)  # challenged for the victim's serial
        attacker.serial, attacker.hmac_key = own_serial, own_key  # answers with its own key
        assert await attacker.activate(gw.ota_url) == 403
        attacker.serial = victim_serial
        with pytest.raises(ActivationRequired):
            await attacker.provision(gw.ota_url)
        assert (await victim.provision(gw.ota_url)).password == info.password
        assert accepts(broker, info.username, info.password)


async def test_a_forgotten_squatters_password_does_not_come_back(broker: Broker) -> None:
    """Attack: an attacker binds a board's MAC first (trust on first use) and keeps the password; the operator runs `snlpgw device forget` and the real board then binds.
    Defence: a password is derived from the MAC, the binding's Client-Id and its generation, so the real board's new binding gets a different password and the broker refuses the squatter's."""
    async with running_gateway(broker, http={"admin_token": TOKEN}) as gw:
        mac = new_mac()
        squatter = await XiaozhiDeviceSim(mac=mac).provision(gw.ota_url)
        status, _ = await admin(gw, "DELETE", f"/admin/devices/{squatter.username}")
        assert status == 200
        board = await XiaozhiDeviceSim(mac=mac).provision(gw.ota_url)  # first contact again
        assert board.password != squatter.password
        assert accepts(broker, board.username, board.password)
        assert connack(broker.host, broker.port, squatter.username, squatter.password) == (
            NOT_AUTHORIZED
        )


async def test_one_hmac_key_cannot_mint_users_past_the_caps(broker: Broker, tmp_path: Path) -> None:
    """Attack: an attacker whose own board has a provisioned (unpinned) HMAC key claims its serial for one random MAC after another and answers each challenge, to mint broker users past the hourly cap.
    Defence: an HMAC activation that would bind a new MAC draws on the same caps as a first contact (`ota_users_per_hour`, `ota_max_devices`): past them /activate answers 202 and no user is created."""
    serial, key = "SN" + secrets.token_hex(8), secrets.token_bytes(32)
    keys = tmp_path / "hmac-keys.json"
    keys.write_text(json.dumps({serial: key.hex()}))
    async with running_gateway(
        broker, ota_hmac_keys_file=keys, ota_users_per_hour=3, ota_ip_burst=1000
    ) as gw:
        users_before = broker_users(broker)
        statuses = []
        for _ in range(8):
            board = XiaozhiDeviceSim(mac=new_mac(), serial=serial, hmac_key=key)
            with pytest.raises(ActivationRequired):
                await board.provision(gw.ota_url)
            statuses.append(await board.activate(gw.ota_url))
            if statuses[-1] == 200:
                await board.provision(gw.ota_url)
        assert statuses == [200] * 3 + [202] * 5
        assert len(broker_users(broker) - users_before) == 3
