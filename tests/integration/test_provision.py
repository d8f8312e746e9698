"""Provisioning against a running broker: the CLI's output works at once (reload happened),
rotation locks out the old password, concurrent provisioning loses nobody, and a restarted
broker keeps its port, users and retained messages."""

from __future__ import annotations

import asyncio
import getpass
import json
import secrets
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from devstack.broker import Broker, LocalMosquitto, free_ports, wait_ready
from devstack.gateway import gateway_settings
from gateway.broker.credentials import Credentials, gateway_password, init_broker_files, provision
from gateway.broker.rules import GATEWAY_USERNAME, Role
from gateway.mqtt.probe import await_login, connack
from gateway.xiaozhi.ota.provisioning import broker_provisioner, broker_revoker
from tests.support.broker import LostFirstSignal, new_device_id
from tests.support.mqtt_client import mqtt_client, publish_reason_code
from tests.support.tls import make_server_certs

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NOT_AUTHORIZED = 135


def cli_provision(broker: Broker, *args: str) -> tuple[int, dict[str, Any] | None, str]:
    """`python -m gateway provision ...` as an operator runs it."""
    argv = [sys.executable, "-m", "gateway", "provision", *args, "--data-dir", str(broker.data_dir)]
    if broker.reload_command is not None and "--reload-command" not in args:
        argv += ["--reload-command", " ".join(broker.reload_command)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    out = json.loads(done.stdout) if done.returncode == 0 else None
    return done.returncode, out, done.stderr


def _creds(out: dict[str, Any]) -> Credentials:
    topics = out["topics"]
    return Credentials(
        username=out["username"],
        password=out["password"],
        role=Role(out["role"]),
        client_id=out["client_id"],
        publish=tuple(topics["publish"]),
        subscribe=tuple(topics["subscribe"]),
    )


async def test_cli_credentials_connect_at_once(broker: Broker, device_id: str) -> None:
    code, out, err = cli_provision(broker, device_id)
    assert code == 0, err
    assert out is not None
    assert out["broker_url"] == f"mqtt://127.0.0.1:{broker.device_port}"  # the devices' listener
    assert out["password"] not in err
    device = _creds(out)
    async with (
        mqtt_client(broker, broker.gateway_credentials()) as gateway,
        mqtt_client(broker, device, client_id=out["client_id"]) as board,
    ):
        await gateway.subscribe(f"snlp/v1/{device_id}/evt")
        await board.subscribe(f"snlp/v1/{device_id}/cmd")
        await board.publish(f"snlp/v1/{device_id}/evt", b'{"evt": "button"}')
        assert (await gateway.expect(f"snlp/v1/{device_id}/evt")).payload == b'{"evt": "button"}'
        await gateway.publish(f"snlp/v1/{device_id}/cmd", b'{"cmd": "WAIT"}')
        assert (await board.expect(f"snlp/v1/{device_id}/cmd")).payload == b'{"cmd": "WAIT"}'


def test_rotation_invalidates_the_old_password(broker: Broker, device_id: str) -> None:
    _, first, _ = cli_provision(broker, device_id)
    _, second, _ = cli_provision(broker, device_id)
    assert first is not None
    assert second is not None
    assert first["password"] != second["password"]
    assert connack(broker.host, broker.port, device_id, first["password"]) == 135
    assert connack(broker.host, broker.port, device_id, second["password"]) == 0


def test_cli_prints_the_rotated_password_when_the_reload_fails(
    broker: Broker, device_id: str
) -> None:
    """The files hold the new password before the broker is signalled: a failing reload
    command must not swallow it (the old one no longer works once the broker reloads)."""
    code, out, err = cli_provision(broker, device_id, "--reload-command", "false")
    assert code == 0, err
    assert out is not None
    assert "reloading the broker failed" in err
    assert out["password"] not in err
    broker.reload()
    wait_ready(broker.host, broker.port, device_id, out["password"])  # raises if refused


def test_cli_role_users_and_refusals(broker: Broker) -> None:
    code, out, err = cli_provision(broker, "--role", "ops", "ops-cli")
    assert code == 0, err
    assert out is not None
    ops = _creds(out)
    assert out["client_id"] is None
    assert out["topics"]["publish"] == []
    assert publish_reason_code(broker, ops, "snlp/v1/ops-cli/evt") == NOT_AUTHORIZED
    code, _, err = cli_provision(broker, "--role", "backend", "ops-cli")
    assert code == 2
    assert "already registered as ops" in err
    code, _, err = cli_provision(broker, "AA-BB-CC-DD-EE-FF")
    assert code == 2
    assert "lowercase MAC" in err


async def test_concurrent_provisioning_all_connect(broker: Broker) -> None:
    ids = [new_device_id() for _ in range(16)]
    results = await asyncio.gather(*(asyncio.to_thread(broker.provision, d) for d in ids))
    codes = await asyncio.gather(
        *(
            asyncio.to_thread(connack, broker.host, broker.port, c.username, c.password)
            for c in results
        )
    )
    assert codes == [0] * len(ids)


def test_ota_provisioner_signals_again_when_a_reload_is_lost(fresh_broker: Broker) -> None:
    """Race: two boards activate at once and the second SIGHUP lands during the first reload.
    Without a second signal the board's password stays unknown until some later reload (the
    board is refused and retries every ~10 s, forever if no other board activates)."""
    broker = fresh_broker  # its own: no other test's reload can stand in for the lost one
    dev, password = new_device_id(), secrets.token_urlsafe(24)
    reload = LostFirstSignal(broker)
    broker_provisioner(gateway_settings(broker), reload=reload)(dev, password)
    assert reload.calls >= 2
    assert connack(broker.host, broker.port, dev, password) == 0


def test_forgetting_a_device_survives_a_lost_reload(fresh_broker: Broker) -> None:
    """Race: an operator forgets a device while another reload runs; the signal is lost. With
    no password to probe, the revoker signals once more half a second later: the device is
    locked out, not left able to log in until some later reload."""
    broker = fresh_broker
    creds = broker.provision(new_device_id())
    reload = LostFirstSignal(broker)
    assert broker_revoker(data_dir=broker.data_dir, reload=reload)(creds.username)
    answer = await_login(
        broker.host, broker.port, creds.username, creds.password, accepted=False, within_s=10
    )
    assert answer == NOT_AUTHORIZED
    assert reload.calls == 2  # the timer's one signal (the revoker sends no more)


def test_harness_provisioning_signals_again_when_a_reload_is_lost(fresh_broker: Broker) -> None:
    """The same race in the tests' own provisioning (the rig's ops client once connected before
    its ACL lines were loaded, and never saw the alarm it waited for)."""
    broker = fresh_broker
    reload = LostFirstSignal(broker)
    creds = provision(broker.data_dir, f"ops-{secrets.token_hex(4)}", role="ops", reload=reload)
    assert creds.password is not None
    assert connack(broker.host, broker.port, creds.username, creds.password) != 0  # lost
    wait_ready(broker.host, broker.port, creds.username, creds.password, reload=reload)
    assert reload.calls >= 2


async def test_restart_keeps_port_users_and_retained(fresh_broker: Broker, device_id: str) -> None:
    device = fresh_broker.provision(device_id)
    port = fresh_broker.port
    status = f"snlp/v1/{device_id}/status"
    async with mqtt_client(fresh_broker, device) as board:
        await board.publish(status, b'{"online": false}', retain=True)
    fresh_broker.stop()
    assert connack(fresh_broker.host, port, device_id, device.password) is None
    fresh_broker.start()
    assert fresh_broker.port == port
    async with mqtt_client(fresh_broker, fresh_broker.gateway_credentials()) as gateway:
        await gateway.subscribe(status)
        retained = await gateway.expect(status)
        assert retained.retain
        assert retained.payload == b'{"online": false}'
    assert connack(fresh_broker.host, port, device_id, device.password) == 0


def test_production_config_serves_devices_over_tls(tmp_path: Path, device_id: str) -> None:
    """mosquitto/mosquitto.prod.conf as shipped (paths and ports substituted) with a test CA."""
    data_dir = tmp_path / "data"
    init_broker_files(data_dir)
    device = provision(data_dir, device_id, reload=None)
    certs = make_server_certs(tmp_path / "certs")
    tls_port, local_port = free_ports(socket.SOCK_STREAM, socket.SOCK_STREAM)
    text = (REPO / "mosquitto" / "mosquitto.prod.conf").read_text()
    for old, new in (
        ("/var/lib/snlpgw", str(data_dir)),
        ("/etc/mosquitto/certs/ca.crt", str(certs.ca)),
        ("/etc/mosquitto/certs/server.crt", str(certs.cert)),
        ("/etc/mosquitto/certs/server.key", str(certs.key)),
        ("listener 8883", f"listener {tls_port}"),
        ("listener 1883 127.0.0.1", f"listener {local_port} 127.0.0.1"),
        ("user snlpgw", f"user {getpass.getuser()}"),
        ("log_dest syslog", "log_dest stderr"),
    ):
        assert old in text
        text = text.replace(old, new)
    config = data_dir / "mosquitto" / "prod.conf"
    config.write_text(text)
    broker = LocalMosquitto(config)
    broker.start()
    try:
        password = gateway_password(data_dir)
        wait_ready("127.0.0.1", local_port, GATEWAY_USERNAME, password, alive=broker.check_alive)
        tls = connack("127.0.0.1", tls_port, device_id, device.password, ca_file=certs.ca)
        assert tls == 0
        # Plain MQTT on the TLS port gets no CONNACK; wrong passwords are refused over TLS.
        assert connack("127.0.0.1", tls_port, device_id, device.password, timeout_s=2) is None
        wrong = connack("127.0.0.1", tls_port, device_id, "x", ca_file=certs.ca)
        assert wrong == NOT_AUTHORIZED
        # Each listener admits only its users: no device on the gateway's, no gateway on the boards'.
        local = connack("127.0.0.1", local_port, device_id, device.password)
        assert local == NOT_AUTHORIZED
        gw_on_tls = connack("127.0.0.1", tls_port, GATEWAY_USERNAME, password, ca_file=certs.ca)
        assert gw_on_tls == NOT_AUTHORIZED
    finally:
        broker.stop()


async def _drain_until_disconnected(client: aiomqtt.Client) -> None:
    async with asyncio.timeout(5):
        async for _ in client.messages:
            pass


async def test_reload_drops_only_the_rotated_session(broker: Broker, device_id: str) -> None:
    """Mosquitto 2.0 re-checks connected clients on reload: rotating a password ends that
    device's live session; the gateway and other devices stay connected."""
    bystander_id = new_device_id()
    device = broker.provision(device_id)
    bystander = broker.provision(bystander_id)
    rotated_board = aiomqtt.Client(
        broker.host,
        broker.port,
        username=device.username,
        password=device.password,
        identifier=f"rotated-{device_id}",  # MQTT 5 paho would send "" (refused by our config)
        protocol=aiomqtt.ProtocolVersion.V5,
    )
    async with (
        mqtt_client(broker, broker.gateway_credentials()) as gateway,
        mqtt_client(broker, bystander) as other,
        rotated_board,
    ):
        await gateway.subscribe(f"snlp/v1/{bystander_id}/evt")
        broker.provision(device_id)  # rotate + reload
        with pytest.raises(aiomqtt.MqttError):
            await _drain_until_disconnected(rotated_board)
        await other.publish(f"snlp/v1/{bystander_id}/evt", b"still here")
        assert (await gateway.expect(f"snlp/v1/{bystander_id}/evt")).payload == b"still here"
