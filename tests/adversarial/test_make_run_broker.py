"""Client-id takeover on the broker exactly as `make run` and `snlpgw broker init` write it (no
test-harness options): Mosquitto disconnects a client when another connects with the same
client id, so on a listener that keeps client ids a device holding only its own credentials
could knock any other device off, and the two would displace each other in turn. The generated
config is the production shape: the devices' listener forces client id := user name and the
gateway's loopback listener admits no device user."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.broker import Broker, LocalMosquitto, free_broker_ports
from gateway.broker.credentials import Credentials
from gateway.broker.layout import BrokerFiles, device_listener_port, local_listener
from gateway.cli.main import main
from gateway.devrun import broker_files
from gateway.settings import Settings
from tests.adversarial.peers import Peer, wait_for
from tests.support.broker import new_device_id

pytestmark = pytest.mark.integration

NOT_AUTHORIZED = 135


def _render(how: str, data_dir: Path, port: int) -> BrokerFiles:
    if how == "make run":  # what `snlpgw dev-run` writes before it starts Mosquitto
        settings = Settings(data_dir=data_dir, mqtt={"url": f"mqtt://127.0.0.1:{port}"})
        return broker_files(settings)
    assert main(["broker", "init", "--data-dir", str(data_dir), "--port", str(port)]) == 0
    return BrokerFiles.at(data_dir)


@pytest.fixture(params=["make run", "broker init"])
def default_broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker]:
    """Mosquitto started on the config as rendered by default (only the ports are free ones)."""
    data_dir = tmp_path / "data"
    (port,), device_port = free_broker_ports()
    files = _render(request.param, data_dir, port)
    assert local_listener(data_dir) == ("127.0.0.1", port)
    assert device_listener_port(data_dir) == device_port
    running = Broker(
        data_dir, port, LocalMosquitto(files.config), files, device_port, devices_on_main=False
    )
    running.start()
    yield running
    running.stop()


def _peer(broker: Broker, port: int | None, creds: Credentials, client_id: str) -> Peer:
    assert port is not None
    return Peer(broker.host, port, creds.username, creds.password, client_id)


async def test_a_device_cannot_take_another_devices_client_id(default_broker: Broker) -> None:
    """Attack: on the broker as `make run` / `snlpgw broker init` render it, device B, holding only its own valid credentials, connects with device A's client id — the `GID_…@@@A@@@uuid` id A uses, then A's bare device id — on the devices' listener, and with A's id on the gateway's listener.
    Defence: the devices' listener binds B's session to B's own id (B's two logins displace each other, never A) and the gateway's listener refuses B (CONNACK 135); A stays connected and keeps receiving its commands."""
    broker = default_broker
    a_dev, b_dev = new_device_id(), new_device_id()
    a_id = f"GID_snlp@@@{a_dev}@@@{uuid.uuid4()}"
    b_creds = broker.provision(b_dev)
    victim = _peer(broker, broker.device_port, broker.provision(a_dev), a_id)
    with_a_gid = _peer(broker, broker.device_port, b_creds, a_id)
    with_a_dev = _peer(broker, broker.device_port, b_creds, a_dev)
    on_gateway_listener = _peer(broker, broker.port, b_creds, a_id)
    gateway = broker.gateway_credentials()
    sender = Peer(
        broker.host, broker.port, gateway.username, gateway.password, f"t-{uuid.uuid4().hex}",
        mqtt5=True,
    )  # fmt: skip
    peers = [victim, with_a_gid, with_a_dev, on_gateway_listener, sender]
    try:
        victim.start()
        assert await victim.wait_connected() == 0
        await victim.subscribe(f"snlp/v1/{a_dev}/cmd")
        with_a_gid.start()
        assert await with_a_gid.wait_connected() == 0  # accepted: as b_dev, not as a_id
        with_a_dev.start()
        assert await with_a_dev.wait_connected() == 0
        # Both of B's logins ran under B's user name: the second displaced the first. That is
        # the kick aimed at A, landing on B itself.
        await wait_for(with_a_gid.dropped, "B's first login displaced by its second")
        on_gateway_listener.start()
        assert await on_gateway_listener.wait_connected() == NOT_AUTHORIZED
        # A takeover happens at CONNECT, so a round trip after all of them finds A either
        # displaced or still there.
        sender.start()
        assert await sender.wait_connected() == 0
        sender.publish(f"snlp/v1/{a_dev}/cmd", b'{"probe":1}', qos=1)
        await wait_for(victim.got_message, "A's command")
        assert victim.messages == [(f"snlp/v1/{a_dev}/cmd", b'{"probe":1}')]
        assert not victim.dropped.is_set()
        assert not with_a_dev.dropped.is_set()
    finally:
        for peer in peers:
            peer.stop()
