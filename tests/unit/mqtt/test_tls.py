"""gateway/mqtt/tls.py: the broker's TLS context from the settings, the file errors it names,
and what real OpenSSL handshake failures are explained as. Handshakes run in memory (two
``ssl.MemoryBIO`` pairs, no socket) against certificates made here (tests/support/tls.py);
the same failures against Mosquitto are in tests/integration/test_mqtt_tls.py."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest

from gateway.metrics import Metrics
from gateway.mqtt.options import ClosedBeforeConnack, MqttError
from gateway.mqtt.tls import (
    REASONS,
    BrokerTls,
    TlsError,
    TlsSetupError,
    broker_context,
    client_context,
    explain,
)
from gateway.settings import MqttSettings
from tests.support.tls import CertFiles, TestCa, make_ca


@pytest.fixture
def ca(tmp_path: Path) -> TestCa:
    return make_ca(tmp_path / "ca.crt")


@pytest.fixture
def server(ca: TestCa, tmp_path: Path) -> CertFiles:
    return ca.issue(tmp_path, "server")


@pytest.fixture
def client(ca: TestCa, tmp_path: Path) -> CertFiles:
    return ca.issue(tmp_path, "client", names=(), client=True)


def settings(**fields: Any) -> MqttSettings:
    return MqttSettings.model_validate({"url": "mqtts://127.0.0.1:8883", **fields})


def server_context(
    files: CertFiles, *, require_client_cert: bool = False, tls12: bool = False
) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.cert, files.key)
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(files.ca)
    if tls12:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    return context


def handshake(
    client_side: ssl.SSLContext, server_side: ssl.SSLContext, host: str = "127.0.0.1"
) -> ssl.SSLError | None:
    """A TLS handshake in memory, then one read by the client (where a TLS 1.3 server's
    refusal of the client's certificate arrives); the client's error, if any."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    tls_client = client_side.wrap_bio(c_in, c_out, server_hostname=host)
    tls_server = server_side.wrap_bio(s_in, s_out, server_side=True)
    client_done = server_done = server_failed = False
    for _ in range(20):
        try:
            if client_done:
                tls_client.read(1)
            else:
                tls_client.do_handshake()
                client_done = True
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLError as exc:
            return exc
        if not (server_done or server_failed):
            try:
                tls_server.do_handshake()
                server_done = True
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError:
                server_failed = True  # its alert is on the way to the client
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    return None


# -- the context ---------------------------------------------------------------------------


def test_the_context_verifies_the_broker_with_tls_12_or_later(ca: TestCa) -> None:
    context = client_context(ca_file=ca.path)
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert context.check_hostname
    assert context.verify_mode == ssl.CERT_REQUIRED
    # ca_file replaces the system's store: its one CA is all that is trusted.
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "snlp test CA"),),)]


def test_without_a_ca_file_the_system_store_is_trusted() -> None:
    context = broker_context(settings())
    assert context is not None
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.cert_store_stats()["x509_ca"] == len(ssl.create_default_context().get_ca_certs())


def test_plain_mqtt_has_no_context() -> None:
    assert broker_context(MqttSettings()) is None


def test_a_good_handshake_with_and_without_a_client_certificate(
    ca: TestCa, server: CertFiles, client: CertFiles
) -> None:
    assert handshake(client_context(ca_file=ca.path), server_context(server)) is None
    with_cert = client_context(ca_file=ca.path, cert_file=client.cert, key_file=client.key)
    assert handshake(with_cert, server_context(server, require_client_cert=True)) is None


@pytest.mark.parametrize(
    ("setting", "breaks", "says"),
    [
        ("ca_file", lambda f: f.ca.unlink(), "No such file or directory"),
        ("ca_file", lambda f: f.ca.write_text("not a certificate\n"), "holds no PEM certificate"),
        ("cert_file", lambda f: f.cert.unlink(), "No such file or directory"),
        ("key_file", lambda f: f.key.unlink(), "No such file or directory"),
        ("key_file", lambda f: (f.key.unlink(), f.key.mkdir()), "Is a directory"),
        ("key_file", lambda f: f.key.write_text("junk\n"), "not a PEM certificate and its"),
    ],
)
def test_an_unusable_file_names_its_setting(
    ca: TestCa, client: CertFiles, setting: str, breaks: Any, says: str
) -> None:
    files = CertFiles(ca.path, client.cert, client.key)
    breaks(files)
    with pytest.raises(TlsSetupError) as caught:
        client_context(ca_file=files.ca, cert_file=files.cert, key_file=files.key)
    assert f"mqtt.{setting}" in str(caught.value)
    assert says in str(caught.value)
    assert caught.value.reason == "files"
    # Both kinds: the connection retries an MqttError; `snlpgw run` reports an OSError.
    assert isinstance(caught.value, MqttError)
    assert isinstance(caught.value, OSError)


def test_an_encrypted_key_is_refused_without_a_prompt(ca: TestCa, tmp_path: Path) -> None:
    locked = ca.issue(tmp_path, "locked", names=(), client=True, passphrase=b"hunter2")
    with pytest.raises(TlsSetupError, match=r"mqtt\.key_file .* is encrypted"):
        client_context(ca_file=ca.path, cert_file=locked.cert, key_file=locked.key)


def test_a_key_of_another_certificate_is_refused_and_never_shown(
    ca: TestCa, client: CertFiles, server: CertFiles
) -> None:
    with pytest.raises(TlsSetupError) as caught:
        client_context(ca_file=ca.path, cert_file=client.cert, key_file=server.key)
    message = str(caught.value)
    assert message == (
        f"TLS: mqtt.key_file {server.key} is not the private key of mqtt.cert_file {client.cert}"
    )
    assert "PRIVATE KEY" not in message
    assert server.key.read_text().splitlines()[1] not in message


def test_a_certificate_without_its_key_is_refused(client: CertFiles) -> None:
    with pytest.raises(TlsSetupError, match="set both or neither"):
        client_context(cert_file=client.cert)


# -- failures explained --------------------------------------------------------------------


def test_a_broker_signed_by_another_ca_is_not_trusted_by_ca_file(
    ca: TestCa, server: CertFiles, tmp_path: Path
) -> None:
    other = make_ca(tmp_path / "other" / "ca.crt", "another CA")
    error = handshake(client_context(ca_file=other.path), server_context(server))
    assert isinstance(error, ssl.SSLCertVerificationError)
    found = explain(MqttError("cannot connect"), settings(ca_file=other.path))
    assert found is None  # no ssl error in that one's chain or text
    wrapped = _wrapped(error)
    found = explain(wrapped, settings(ca_file=other.path))
    assert found is not None
    assert found.reason == "untrusted"
    assert str(found).startswith(
        f"TLS: the broker's certificate is not trusted by mqtt.ca_file {other.path} "
    )
    assert "unable to get local issuer certificate" in str(found)


def test_without_ca_file_the_message_says_to_set_it(ca: TestCa, server: CertFiles) -> None:
    error = handshake(client_context(), server_context(server))
    found = explain(_wrapped(error), settings())
    assert found is not None
    assert found.reason == "untrusted"
    assert "system's CA store" in str(found)
    assert "set mqtt.ca_file" in str(found)


def test_a_certificate_for_another_host_name(ca: TestCa, tmp_path: Path) -> None:
    elsewhere = ca.issue(tmp_path, "elsewhere", names=("broker.example",))
    error = handshake(client_context(ca_file=ca.path), server_context(elsewhere))
    found = explain(_wrapped(error), settings(ca_file=ca.path))
    assert found is not None
    assert found.reason == "hostname"
    assert "does not name 127.0.0.1" in str(found)
    assert "mqtt.url" in str(found)


def test_an_expired_broker_certificate(ca: TestCa, tmp_path: Path) -> None:
    old = ca.issue(tmp_path, "old", valid_days=-1)
    error = handshake(client_context(ca_file=ca.path), server_context(old))
    found = explain(_wrapped(error), settings(ca_file=ca.path))
    assert found is not None
    assert found.reason == "expired"
    assert "validity period" in str(found)


@pytest.mark.parametrize("tls12", [True, False], ids=["tls1.2", "tls1.3"])
def test_a_broker_requiring_a_client_certificate(
    ca: TestCa, server: CertFiles, client: CertFiles, tmp_path: Path, tls12: bool
) -> None:
    """TLS 1.2 fails in the handshake; TLS 1.3 after it, on the first read: said alike."""
    requiring = server_context(server, require_client_cert=True, tls12=tls12)
    error = handshake(client_context(ca_file=ca.path), requiring)
    assert error is not None
    found = explain(_wrapped(error), settings(ca_file=ca.path))
    assert found is not None
    assert found.reason == "client_cert"
    assert str(found).startswith("TLS: the broker requires a client certificate (")
    assert str(found).endswith("set mqtt.cert_file and mqtt.key_file")
    # One from a CA the broker does not trust is refused, said as such.
    stranger_ca = make_ca(tmp_path / "stranger" / "ca.crt", "stranger CA")
    stranger = stranger_ca.issue(tmp_path / "stranger", "client", names=(), client=True)
    fields = {"ca_file": ca.path, "cert_file": stranger.cert, "key_file": stranger.key}
    context = client_context(**fields)
    found = explain(_wrapped(handshake(context, requiring)), settings(**fields))
    assert found is not None
    assert found.reason == "client_cert"
    assert f"refused the client certificate of mqtt.cert_file {stranger.cert}" in str(found)


def test_an_alert_known_only_from_the_message_text() -> None:
    """How the client reports a TLS 1.3 alert today: the connection lost, the ssl error only
    in the text."""
    lost = MqttError(
        "connection lost: [SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate "
        "required (_ssl.c:2580)"
    )
    found = explain(lost, settings())
    assert found is not None
    assert found.reason == "client_cert"
    assert "(tlsv13 alert certificate required)" in str(found)


def test_other_handshake_failures_name_the_listener() -> None:
    found = explain(MqttError("lost: [SSL: WRONG_VERSION_NUMBER] wrong version number"), settings())
    assert found is not None
    assert found.reason == "handshake"
    assert "is 127.0.0.1:8883 (mqtt.url) the broker's TLS listener?" in str(found)


def test_no_tls_failure_is_explained_as_none() -> None:
    assert explain(MqttError("cannot connect to the broker: refused"), settings()) is None
    plain = MqttSettings()
    assert explain(_wrapped(ssl.SSLError(1, "[SSL: X] x")), plain) is None  # TLS off
    setup = TlsSetupError("TLS: mqtt.ca_file x cannot be read")
    assert explain(setup, settings()) is setup


async def test_the_connection_counts_tls_failures_by_reason(
    ca: TestCa, server: CertFiles, tmp_path: Path
) -> None:
    metrics = Metrics()
    tls = BrokerTls(settings(ca_file=tmp_path / "missing.crt"), metrics)

    def count(reason: str) -> float | None:
        name = "snlpgw_mqtt_tls_failures_total"
        return metrics.registry.get_sample_value(name, {"reason": reason})

    assert [count(r) for r in REASONS] == [0.0] * len(REASONS)
    with pytest.raises(TlsSetupError, match=r"mqtt\.ca_file .*missing\.crt cannot be read"):
        await tls.context()
    assert count("files") == 1
    error = handshake(client_context(), server_context(server))
    found = tls.failure(_wrapped(error))
    assert isinstance(found, TlsError)
    assert count("untrusted") == 1
    assert tls.failure(MqttError("timed out connecting to the broker")) is None
    assert sum(count(r) or 0 for r in REASONS) == 2
    # Plain MQTT: no context, no series.
    plain_metrics = Metrics()
    plain = BrokerTls(MqttSettings(), plain_metrics)
    assert await plain.context() is None
    name = "snlpgw_mqtt_tls_failures_total"
    assert plain_metrics.registry.get_sample_value(name, {"reason": "files"}) is None


def _wrapped(error: BaseException | None) -> MqttError:
    """As Client.connect raises it: an MqttError from the OSError."""
    assert error is not None
    wrapped = MqttError(f"cannot connect to the broker: {error}")
    wrapped.__cause__ = error  # `raise ... from error`
    return wrapped


def test_a_close_before_connack_over_tls_is_said_as_the_client_certificate() -> None:
    """TLS 1.3: the listener's alert and its close race; when the close wins, the gateway
    still says what to fix, the same as when the alert wins."""
    closed = ClosedBeforeConnack("connection lost: [Errno 104] Connection reset by peer")
    plain = MqttSettings(url="mqtt://127.0.0.1:1883")  # type: ignore[arg-type]
    assert explain(closed, plain) is None
    tls = MqttSettings(url="mqtts://127.0.0.1:8883")  # type: ignore[arg-type]
    missing = explain(closed, tls)
    assert missing is not None
    assert missing.reason == "client_cert"
    assert str(missing).startswith("TLS: the broker requires a client certificate (")
