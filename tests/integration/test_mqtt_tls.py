"""TLS from the gateway to a real Mosquitto (gateway/mqtt/tls.py), certificates made at test time
(tests/support/tls.py): the project's generated config (password file and ACL: auth stays on)
plus TLS listeners on loopback: server certificate only, and ``require_certificate``. A
client certificate is refused in the handshake with TLS 1.2 and after it with TLS 1.3 (Mosquitto
2.0.11's ``tls_version tlsv1.2`` still offers 1.3, so the client is capped to test 1.2).

The gateway's own connection connects over mqtts:// with ``mqtt.ca_file`` and a QoS 1 publish
round-trips; a wrong CA, a missing or refused client certificate each give one log line naming
the setting to fix per attempt, and the connection keeps retrying with its back-off; the doctor
says the same; unreadable files stop ``snlpgw run`` at start. Every wait is on an event with a
generous bound, never a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import socket
import ssl
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devstack.broker import Broker, LocalMosquitto, free_ports
from devstack.gateway import gateway_settings
from gateway.broker.credentials import init_broker_files
from gateway.doctor.acl import check_acl
from gateway.doctor.network import Findings, check_broker
from gateway.doctor.report import Status
from gateway.mqtt import tls
from gateway.mqtt.connection import MqttConnection
from gateway.mqtt.edge import Inbound
from gateway.service import Context
from gateway.settings import MqttSettings, Settings
from tests.support.tls import CertFiles, TestCa, make_ca

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 30.0  # bound of every wait on the broker (a busy 2-core machine)
CONNECTION_LOG = "gateway.mqtt.connection"


@dataclass(frozen=True)
class TlsBroker:
    broker: Broker
    ca: TestCa
    server: CertFiles
    client: CertFiles  # signed by the broker's CA
    stranger: CertFiles  # a client certificate from a CA the broker does not trust
    other_ca: Path  # a CA that did not sign the broker's certificate
    tls_port: int  # server certificate only
    mtls_port: int  # require_certificate

    def url(self, port: int) -> str:
        return f"mqtts://127.0.0.1:{port}"


def _listener(port: int, server: CertFiles, *extra: str) -> str:
    lines = [
        f"listener {port} 127.0.0.1",
        f"cafile {server.ca}",
        f"certfile {server.cert}",
        f"keyfile {server.key}",
        *extra,
    ]
    return "\n".join(["", *lines, ""])


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    root = tmp_path_factory.mktemp("tls-broker")
    certs = root / "certs"
    ca = make_ca(certs / "ca.crt")
    server = ca.issue(certs, "server")
    client = ca.issue(certs, "client", names=(), client=True)
    stranger_ca = make_ca(certs / "stranger" / "ca.crt", "stranger CA")
    stranger = stranger_ca.issue(certs / "stranger", "client", names=(), client=True)
    other_ca = make_ca(certs / "other" / "ca.crt", "another CA").path
    plain, tls, mtls = free_ports(*[socket.SOCK_STREAM] * 3)
    data_dir = root / "data"
    files = init_broker_files(data_dir, listener_host="127.0.0.1", listener_port=plain)
    with files.config.open("a") as config:  # per_listener_settings false: one passwd, one ACL
        config.write(_listener(tls, server))
        config.write(_listener(mtls, server, "require_certificate true"))
    broker = Broker(data_dir, plain, LocalMosquitto(files.config), files)
    broker.start()  # returns once the gateway user logs in (every listener is open by then)
    try:
        yield TlsBroker(broker, ca, server, client, stranger, other_ca, tls, mtls)
    finally:
        broker.stop()


def tls_settings(tls_broker: TlsBroker, data_dir: Path | None, port: int, **mqtt: Any) -> Settings:
    """The test gateway's settings for ``port``; ``data_dir`` None: the broker's."""
    fields = {"url": tls_broker.url(port), **{k: str(v) for k, v in mqtt.items()}}
    return gateway_settings(tls_broker.broker, data_dir, mqtt=fields)


class FailureLog(logging.Handler):
    """The connection's warnings, each with the monotonic time it was logged; ``wait(n)``
    returns once there are ``n``."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[tuple[float, str]] = []
        self._grew = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((time.monotonic(), record.getMessage()))
        self._grew.set()  # logged on the loop's thread (the connection's task)

    async def wait(self, count: int) -> None:
        async with asyncio.timeout(WAIT_S):
            while len(self.lines) < count:
                self._grew.clear()
                await self._grew.wait()


@contextlib.asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[tuple[MqttConnection, FailureLog]]:
    """The gateway's broker connection (as the service builds it) running, its warnings
    recorded; cancelled at the end."""
    mqtt = Context.create(settings).mqtt
    failures = FailureLog()
    logger = logging.getLogger(CONNECTION_LOG)
    logger.addHandler(failures)
    task = asyncio.create_task(mqtt.run(), name="test.mqtt")
    try:
        yield mqtt, failures
        assert not task.done(), "the connection's task ended (it must retry, never crash)"
    finally:
        logger.removeHandler(failures)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _capped_at_tls12(
    build: Callable[[MqttSettings], ssl.SSLContext | None],
) -> Callable[[MqttSettings], ssl.SSLContext | None]:
    def capped(settings: MqttSettings) -> ssl.SSLContext | None:
        context = build(settings)
        if context is not None:
            context.maximum_version = ssl.TLSVersion.TLSv1_2
        return context

    return capped


def tls_failures(mqtt: MqttConnection, reason: str) -> float:
    value = mqtt._tls._failures.labels(reason)._value.get()  # the counter's child
    return float(value)


_DELAY = re.compile(r"; reconnecting in ([0-9.]+)s$")


def assert_retried_with_backoff(mqtt: MqttConnection, failures: FailureLog, says: str) -> None:
    """Every attempt logged one line saying ``says``, and the next attempt waited its delay."""
    assert failures.lines
    for _, line in failures.lines:
        assert says in line, line
        assert _DELAY.search(line), line
    settings = mqtt._settings
    times = [at for at, _ in failures.lines]
    delays = [float(m.group(1)) for _, line in failures.lines if (m := _DELAY.search(line))]
    for delay in delays:
        assert settings.reconnect_min_s - 0.01 <= delay <= settings.reconnect_max_s + 0.01
    for (earlier, later), delay in zip(itertools.pairwise(times), delays, strict=False):
        assert later - earlier >= delay - 0.01  # the back-off was waited, not skipped
    assert not mqtt.connected


async def test_the_gateway_connects_over_mqtts_with_ca_file_and_a_qos1_publish_round_trips(
    tls_broker: TlsBroker, tmp_path: Path
) -> None:
    settings = tls_settings(tls_broker, tmp_path, tls_broker.tls_port, ca_file=tls_broker.ca.path)
    topic = f"snlpgw/v1/ops/{settings.gateway_id}/events"
    loop = asyncio.get_running_loop()
    received: asyncio.Future[Inbound] = loop.create_future()
    acked: asyncio.Future[None] = loop.create_future()
    async with running(settings) as (mqtt, failures):
        mqtt.route(topic, lambda m: received.done() or received.set_result(m), qos=1)
        async with asyncio.timeout(WAIT_S):
            await mqtt.wait_connected()
        client = mqtt._client
        assert client is not None
        assert client._transport is not None
        ssl_object = client._transport.get_extra_info("ssl_object")
        assert ssl_object is not None
        assert ssl_object.version() in ("TLSv1.2", "TLSv1.3")
        mqtt.publish(topic, b'{"tls": true}', qos=1, on_sent=lambda: acked.set_result(None))
        async with asyncio.timeout(WAIT_S):
            await acked  # the broker's PUBACK
            message = await received  # and back through the gateway's subscription
        assert (message.payload, message.qos) == (b'{"tls": true}', 1)
        assert failures.lines == []
        assert mqtt.connection_count == 1


async def test_a_wrong_ca_is_refused_with_a_clear_error_and_retried_with_backoff(
    tls_broker: TlsBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncio")
    other = tls_broker.other_ca
    settings = tls_settings(tls_broker, tmp_path, tls_broker.tls_port, ca_file=other)
    async with running(settings) as (mqtt, failures):
        await failures.wait(3)
        says = (
            f"broker connection lost (TLS: the broker's certificate is not trusted by "
            f"mqtt.ca_file {other} ("
        )
        assert_retried_with_backoff(mqtt, failures, says)
        for _, line in failures.lines:  # OpenSSL's words between: Mosquitto sends its CA too
            assert "certificate in certificate chain): give the CA that signed it); " in line
        assert tls_failures(mqtt, "untrusted") >= 3
        assert mqtt.connection_count == 0
    # Nothing else said it: no traceback, no asyncio "Fatal error on SSL transport".
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        line for _, line in failures.lines
    ]


@pytest.mark.parametrize("tls12", [False, True], ids=["tls1.3", "tls1.2"])
async def test_a_broker_requiring_a_client_certificate(
    tls_broker: TlsBroker, tmp_path: Path, tls12: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if tls12:
        monkeypatch.setattr(tls, "broker_context", _capped_at_tls12(tls.broker_context))
    port = tls_broker.mtls_port
    ca = tls_broker.ca.path
    client = tls_broker.client
    # With the certificate: connected, and the broker still wants the password (auth on).
    with_cert = tls_settings(
        tls_broker, tmp_path / "with", port, ca_file=ca, cert_file=client.cert, key_file=client.key
    )
    async with running(with_cert) as (mqtt, failures):
        async with asyncio.timeout(WAIT_S):
            await mqtt.wait_connected()
        assert failures.lines == []
        assert mqtt._client is not None
        assert mqtt._client._transport is not None
        ssl_object = mqtt._client._transport.get_extra_info("ssl_object")
        assert ssl_object.version() == ("TLSv1.2" if tls12 else "TLSv1.3")
    # Without it: refused, said as the settings to set, retried.
    without = tls_settings(tls_broker, tmp_path / "without", port, ca_file=ca)
    async with running(without) as (mqtt, failures):
        await failures.wait(2)
        assert_retried_with_backoff(
            mqtt, failures, "TLS: the broker requires a client certificate ("
        )
        assert all(
            line.endswith(
                "): set mqtt.cert_file and mqtt.key_file); reconnecting in "
                + line.rpartition("reconnecting in ")[2]
            )
            for _, line in failures.lines
        )
        assert tls_failures(mqtt, "client_cert") >= 2
    # One from a CA the broker does not trust: refused, said as such.
    stranger = tls_broker.stranger
    wrong = tls_settings(
        tls_broker,
        tmp_path / "stranger",
        port,
        ca_file=ca,
        cert_file=stranger.cert,
        key_file=stranger.key,
    )
    async with running(wrong) as (mqtt, failures):
        await failures.wait(2)
        assert_retried_with_backoff(
            mqtt, failures, f"TLS: the broker refused the client certificate of mqtt.cert_file "
            f"{stranger.cert} ("
        )  # fmt: skip


async def test_a_password_is_still_needed_over_tls(tls_broker: TlsBroker, tmp_path: Path) -> None:
    """TLS adds to the broker's password check; it replaces nothing."""
    ca = tls_broker.ca.path
    wrong = tls_settings(tls_broker, tmp_path, tls_broker.tls_port, ca_file=ca, password="x")
    async with running(wrong) as (mqtt, failures):
        await failures.wait(2)
        assert_retried_with_backoff(mqtt, failures, "reason code 135")
        assert sum(tls_failures(mqtt, r) for r in ("untrusted", "client_cert", "handshake")) == 0


def test_the_doctor_uses_the_same_tls_settings_and_says_the_error(
    tls_broker: TlsBroker, tmp_path: Path
) -> None:
    ca = tls_broker.ca.path
    good = tls_settings(tls_broker, None, tls_broker.tls_port, ca_file=ca)  # its broker files
    found = Findings()
    rows = check_broker(good, found)
    assert [(r.check, r.status) for r in rows] == [
        ("broker reachable", Status.OK),
        ("broker credentials", Status.OK),
    ], rows
    assert "accepts TLS" in rows[0].detail
    # The ACL row logs a throwaway device and the gateway in on that listener, TLS alike.
    acl = check_acl(good, found, tls_broker.broker.reload)
    assert acl.status is Status.OK, acl
    wrong = tls_settings(tls_broker, tmp_path, tls_broker.tls_port, ca_file=tls_broker.other_ca)
    rows = check_broker(wrong, Findings())
    assert rows[0].status is Status.FAIL
    assert "TLS: the broker's certificate is not trusted by mqtt.ca_file" in rows[0].detail
    assert rows[1].status is Status.SKIP
    no_cert = tls_settings(tls_broker, tmp_path, tls_broker.mtls_port, ca_file=ca)
    rows = check_broker(no_cert, Findings())
    assert rows[0].status is Status.FAIL
    assert "requires a client certificate" in rows[0].detail
    assert "set mqtt.cert_file and mqtt.key_file" in rows[0].detail
    client = tls_broker.client
    with_cert = tls_settings(
        tls_broker, tmp_path, tls_broker.mtls_port, ca_file=ca, cert_file=client.cert,
        key_file=client.key,
    )  # fmt: skip
    rows = check_broker(with_cert, Findings())
    assert [r.status for r in rows] == [Status.OK, Status.OK], rows
    missing = tls_settings(tls_broker, tmp_path, tls_broker.tls_port, ca_file=tmp_path / "no.crt")
    rows = check_broker(missing, Findings())
    assert rows[0].status is Status.FAIL
    assert f"TLS: mqtt.ca_file {tmp_path / 'no.crt'} cannot be read" in rows[0].detail


async def test_an_unreadable_tls_file_stops_the_start_with_the_setting_named(
    tls_broker: TlsBroker, tmp_path: Path
) -> None:
    """`snlpgw run`: exit 2 and one line, before any connect (not a failure per reconnect)."""
    missing = tmp_path / "absent.key"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNLPGW_")}
    env.update(
        SNLPGW_DATA_DIR=str(tmp_path / "data"),
        SNLPGW_MQTT__URL=tls_broker.url(tls_broker.tls_port),
        SNLPGW_MQTT__CA_FILE=str(tls_broker.ca.path),
        SNLPGW_MQTT__CERT_FILE=str(tls_broker.client.cert),
        SNLPGW_MQTT__KEY_FILE=str(missing),
        SNLPGW_HTTP__PORT="0",
        SNLPGW_HTTP__ADMIN_PORT="0",
        SNLPGW_UDP__PORT="0",
        SNLPGW_ASR__ENGINE="none",
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "run", cwd=REPO, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(120):
        out, err = await proc.communicate()
    assert proc.returncode == 2, (out + err).decode()
    assert (
        f"snlpgw: cannot start: TLS: mqtt.key_file {missing} cannot be read "
        "(No such file or directory)"
    ) in err.decode()
    assert "Traceback" not in err.decode()
