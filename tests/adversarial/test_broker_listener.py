"""Cross-listener client-id takeover on the real broker. Client ids are one namespace across
Mosquitto's listeners: the device listener renames a board to its bare device id, so a device
credential that could log in on the gateway's listener (which keeps client ids as given) could
take that id and knock the board off. `snlpgw broker init` (and `make run`) gives the
gateway's listener a password file without device users (`per_listener_settings true`)."""

from __future__ import annotations

import logging
import secrets
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.gateway import gateway_settings
from gateway.broker.credentials import Credentials, revoke
from gateway.mqtt.probe import await_login, connack
from gateway.xiaozhi.ota.provisioning import broker_provisioner
from tests.adversarial.peers import Peer, wait_for
from tests.support.broker import Broker, LostFirstSignal, new_device_id, start_broker

pytestmark = pytest.mark.integration

NOT_AUTHORIZED = 135


@pytest.fixture
def split_broker(tmp_path: Path) -> Iterator[Broker]:
    """The broker exactly as `snlpgw broker init` and `make run` configure it."""
    running = start_broker(tmp_path / "data", split=True)
    yield running
    running.stop()


def _peer(broker: Broker, port: int | None, creds: Credentials, client_id: str) -> Peer:
    assert port is not None
    return Peer(broker.host, port, creds.username, creds.password, client_id, mqtt5=True)


async def _takeover(broker: Broker, attacker_port: int | None) -> tuple[Peer, Peer, int]:
    """A victim board on the device listener, then an attacker device logging in on
    ``attacker_port`` with the victim's bare device id (the id the device listener gave the
    victim). Returns (victim, gateway sender, the attacker's CONNACK code); peers are started."""
    victim_dev = new_device_id()
    victim = _peer(broker, broker.device_port, broker.provision(victim_dev), "GID_x@@@v@@@u")
    victim.mqtt5 = False  # the firmware speaks MQTT 3.1.1
    victim.start()
    assert await victim.wait_connected() == 0
    await victim.subscribe(f"snlp/v1/{victim_dev}/cmd")
    gateway = _peer(broker, broker.port, broker.gateway_credentials(), f"t-{uuid.uuid4().hex}")
    gateway.start()
    assert await gateway.wait_connected() == 0
    attacker = _peer(broker, attacker_port, broker.provision(new_device_id()), victim_dev)
    attacker.start()
    try:
        code = await attacker.wait_connected()
    finally:
        attacker.stop()
    return victim, gateway, code


async def test_device_cannot_log_in_on_the_gateway_listener(split_broker: Broker) -> None:
    """Attack: a device credential logs in on the gateway's listener, once with the gateway's client id and once with another board's bare device id (the id the device listener gave that board).
    Defence: the gateway's listener has no device users (per-listener password files), so both logins get CONNACK 135 and neither the gateway nor the board is disconnected."""
    broker = split_broker
    victim, gateway, code = await _takeover(broker, broker.port)
    peers = [victim, gateway]
    try:
        assert code == NOT_AUTHORIZED
        squatter = _peer(broker, broker.port, broker.provision(new_device_id()), gateway.client_id)
        squatter.start()
        try:
            assert await squatter.wait_connected() == NOT_AUTHORIZED
        finally:
            squatter.stop()
        # A takeover happens before the CONNACK, so after both refusals the round trip below
        # would find the victim (or the gateway) already disconnected.
        victim_dev = victim.username
        gateway.publish(f"snlp/v1/{victim_dev}/cmd", b'{"probe":1}', qos=1)
        await wait_for(victim.got_message, "the victim's command")
        assert victim.messages == [(f"snlp/v1/{victim_dev}/cmd", b'{"probe":1}')]
        assert not victim.dropped.is_set()
        assert not gateway.dropped.is_set()
    finally:
        for peer in peers:
            peer.stop()


async def test_the_takeover_works_where_devices_share_the_gateway_listener(
    broker: Broker,
) -> None:
    """Attack: the same cross-listener takeover on a broker whose gateway listener still admits device users (the test harness's shared mode, as before this fix).
    Defence: none there: the victim is displaced, which shows the split password files are what stops the attack."""
    victim, gateway, code = await _takeover(broker, broker.port)
    try:
        assert code == 0
        await wait_for(victim.dropped, "the victim displaced by the attacker's login")
    finally:
        victim.stop()
        gateway.stop()


def test_each_listener_admits_only_its_users_and_follows_provisioning(
    split_broker: Broker,
) -> None:
    """Attack: a device provisioned (and later revoked) while the broker runs tries the gateway's listener, and the gateway, ops and backend users try the device listener.
    Defence: after each SIGHUP reload the device logs in on the device listener only (and nowhere once revoked); the other roles log in on the gateway's listener only."""
    broker = split_broker
    host, gw_port, dev_port = broker.host, broker.port, broker.device_port
    assert dev_port is not None
    device = broker.provision(new_device_id())
    assert connack(host, dev_port, device.username, device.password) == 0
    assert connack(host, gw_port, device.username, device.password) == NOT_AUTHORIZED
    others = [
        broker.gateway_credentials(),
        broker.provision("ops-listener", "ops"),
        broker.provision("backend-listener", "backend"),
    ]
    for creds in others:
        assert connack(host, gw_port, creds.username, creds.password) == 0
        code = connack(host, dev_port, creds.username, creds.password)
        assert code == NOT_AUTHORIZED
    assert connack(host, gw_port, None, None) == NOT_AUTHORIZED
    assert connack(host, dev_port, None, None) == NOT_AUTHORIZED
    assert revoke(broker.data_dir, device.username, reload=broker.reload)
    # The reload runs in the broker's loop, a moment after the signal: wait for it.
    code = await_login(
        host, dev_port, device.username, device.password, accepted=False, within_s=10
    )
    assert code == NOT_AUTHORIZED


def test_ota_provisioning_confirms_on_the_listener_boards_use(
    split_broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """Attack: a board activates over OTA on the deployed split-listener broker while another reload runs, so the reload signal for its new password is lost.
    Defence: the provisioner confirms the password where OTA sends boards (the device listener; the gateway's admits no device user), sees it refused and signals again, so the board is accepted before OTA answers."""
    broker = split_broker
    dev, password = new_device_id(), secrets.token_urlsafe(24)
    reload = LostFirstSignal(broker)
    with caplog.at_level(logging.WARNING, logger="gateway.xiaozhi.ota.provisioning"):
        broker_provisioner(gateway_settings(broker), reload=reload)(dev, password)
    assert "did not accept" not in caplog.text
    assert reload.calls >= 2  # the lost signal was noticed and sent again
    assert connack(broker.host, broker.device_port, dev, password) == 0
