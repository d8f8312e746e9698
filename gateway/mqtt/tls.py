"""TLS to the broker: the client's :class:`ssl.SSLContext` from the settings, and what a failed
TLS connection means, said as the setting to fix (``docs/mqtt.md`` "TLS to the broker").

* :func:`client_context` builds the context from plain paths (TLS 1.2 or later, the broker's
  certificate and host name verified against ``ca_file`` or the system's CA store, an optional
  client certificate); :func:`broker_context` does it from :class:`MqttSettings` (``None`` for
  ``mqtt://``). Neither knows paho or asyncio: the gateway's connection, the probe and the
  doctor use them alike. A file that cannot be used raises :class:`TlsSetupError`, which names
  the setting and never shows a key's content.
* :func:`explain` turns a failed connect (an ``ssl`` error in the exception's chain, or the
  ``[SSL: …]`` reason in its text: a TLS 1.3 broker refuses a client certificate only after
  the handshake, and the client sees that alert as the connection lost) into a
  :class:`TlsError` with one of :data:`REASONS` and a message naming what to fix.
* :class:`BrokerTls` is what the connection holds: a context per connect (built off the loop,
  so a renewed certificate file is picked up at the next reconnect), failures explained and
  counted in ``snlpgw_mqtt_tls_failures_total{reason}``.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from gateway.mqtt.options import ClosedBeforeConnack, MqttError
from gateway.settings import MqttSettings

if TYPE_CHECKING:
    from gateway.metrics import Metrics

TlsReason = Literal["untrusted", "hostname", "expired", "client_cert", "handshake", "files"]
REASONS: tuple[TlsReason, ...] = get_args(TlsReason)

# OpenSSL's X509_V_ERR_* codes that are not about who signed the certificate.
_EXPIRED = {9, 10}  # not yet valid, expired
_NAME_MISMATCH = {62, 63, 64}  # host name, e-mail, IP address
# Alerts a broker sends about the client's certificate (a server's own certificate is checked
# here and fails as SSLCertVerificationError, never as an alert received).
_NO_CLIENT_CERT = {"TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT_HANDSHAKE_FAILURE"}
_BAD_CLIENT_CERT = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED",
    "SSLV3_ALERT_BAD_CERTIFICATE",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
    "SSLV3_ALERT_CERTIFICATE_REVOKED",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
    "TLSV1_ALERT_UNKNOWN_CA",
    "TLSV1_ALERT_ACCESS_DENIED",
}
_SSL_REASON = re.compile(r"\[SSL: ([A-Z0-9_]+)\]")


class TlsError(MqttError):
    """A TLS connection to the broker failed; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: TlsReason, message: str) -> None:
        super().__init__(message)
        self.reason: TlsReason = reason


class TlsSetupError(TlsError, OSError):
    """A TLS file named by the settings cannot be used. An :class:`MqttError`, so the
    connection logs it and retries; an :class:`OSError`, so ``snlpgw run`` reports it at
    start-up as it does a port in use."""

    def __init__(self, message: str) -> None:
        super().__init__("files", message)


class _EncryptedKey(Exception):
    """Raised from the key's password callback: OpenSSL would otherwise prompt on the tty."""


def client_context(
    *, ca_file: Path | None = None, cert_file: Path | None = None, key_file: Path | None = None
) -> ssl.SSLContext:
    """A client context for the broker: TLS 1.2 or later, certificate and host name verified;
    trusting ``ca_file`` (PEM bundle) instead of the system's store when given, presenting
    ``cert_file`` with its ``key_file`` (both or neither) when given.

    Raises :class:`TlsSetupError` naming the ``mqtt.*`` setting whose file is missing,
    unreadable, not PEM, encrypted, or (key) not the certificate's."""
    if (cert_file is None) != (key_file is None):
        raise TlsSetupError(
            "TLS: mqtt.cert_file and mqtt.key_file go together: set both or neither"
        )
    for setting, path in (("ca_file", ca_file), ("cert_file", cert_file), ("key_file", key_file)):
        if path is not None:
            _check_readable(setting, path)
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    except ssl.SSLError as exc:
        raise TlsSetupError(
            f"TLS: mqtt.ca_file {ca_file} holds no PEM certificate ({exc})"
        ) from exc
    except OSError as exc:  # pragma: no cover - a race: it was readable just above
        raise TlsSetupError(f"TLS: mqtt.ca_file {ca_file} cannot be read ({exc})") from exc
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    if cert_file is not None and key_file is not None:
        _load_client_certificate(context, cert_file, key_file)
    return context


def _check_readable(setting: str, path: Path) -> None:
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise TlsSetupError(f"TLS: mqtt.{setting} {path} cannot be read ({reason})") from exc


def _refuse_password() -> bytes:
    raise _EncryptedKey


def _load_client_certificate(context: ssl.SSLContext, cert_file: Path, key_file: Path) -> None:
    try:
        context.load_cert_chain(cert_file, key_file, password=_refuse_password)
    except _EncryptedKey:
        raise TlsSetupError(
            f"TLS: mqtt.key_file {key_file} is encrypted: give the key without a passphrase "
            "(readable only by the gateway's user)"
        ) from None
    except ssl.SSLError as exc:
        # OpenSSL's reason only (e.g. KEY_VALUES_MISMATCH, PEM lib), never the files' bytes.
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TlsSetupError(
                f"TLS: mqtt.key_file {key_file} is not the private key of mqtt.cert_file "
                f"{cert_file}"
            ) from None
        detail = _detail(exc)
        raise TlsSetupError(
            f"TLS: mqtt.cert_file {cert_file} and mqtt.key_file {key_file} are not a PEM "
            f"certificate and its private key ({detail})"
        ) from None
    except OSError as exc:  # pragma: no cover - a race: it was readable just above
        raise TlsSetupError(f"TLS: mqtt.cert_file or mqtt.key_file cannot be read ({exc})") from exc


def broker_context(settings: MqttSettings) -> ssl.SSLContext | None:
    """:func:`client_context` from the settings; ``None`` for an ``mqtt://`` URL."""
    if not settings.tls:
        return None
    return client_context(
        ca_file=settings.ca_file, cert_file=settings.cert_file, key_file=settings.key_file
    )


def explain(error: BaseException, settings: MqttSettings) -> TlsError | None:  # noqa: PLR0911
    """The TLS failure behind ``error`` as a :class:`TlsError` saying which setting to fix;
    ``None`` when ``error`` is no TLS failure (or TLS is off). A :class:`TlsError` is itself."""
    if isinstance(error, TlsError):
        return error
    if not settings.tls:
        return None
    found = _ssl_error(error)
    if isinstance(found, ssl.SSLCertVerificationError):
        return _untrusted(found, settings)
    if found is not None:
        return _refused(found.reason or "", _detail(found), settings)
    if match := _SSL_REASON.search(str(error)):
        return _refused(match.group(1), reason_text(match.group(1)), settings)
    if isinstance(error, ClosedBeforeConnack):
        # TLS 1.3: the listener's refusal of the client certificate (an alert) and its close
        # race; when the close wins, this is all there is to see. Said the same either way.
        detail = f"the broker closed the connection before its CONNACK: {error}"
        return _refused("TLSV13_ALERT_CERTIFICATE_REQUIRED", detail, settings)
    return None


def _refused(reason: str, detail: str, settings: MqttSettings) -> TlsError:
    """A handshake that failed on the broker's side (an alert) or on ours (not verification)."""
    client_cert = settings.cert_file is not None
    if not client_cert and reason in _NO_CLIENT_CERT:
        return TlsError(
            "client_cert",
            f"TLS: the broker requires a client certificate ({detail}): "
            "set mqtt.cert_file and mqtt.key_file",
        )
    if client_cert and reason in _BAD_CLIENT_CERT:
        return TlsError(
            "client_cert",
            f"TLS: the broker refused the client certificate of mqtt.cert_file "
            f"{settings.cert_file} ({detail}): it must be signed by a CA the broker's listener "
            "trusts (its cafile)",
        )
    return TlsError(
        "handshake",
        f"TLS: the handshake with the broker failed ({detail}): is {settings.host}:"
        f"{settings.port} (mqtt.url) the broker's TLS listener?",
    )


def _ssl_error(error: BaseException) -> ssl.SSLError | None:
    """The first ``ssl.SSLError`` in ``error``'s cause/context chain (itself included)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, ssl.SSLError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _untrusted(exc: ssl.SSLCertVerificationError, settings: MqttSettings) -> TlsError:
    code, detail = exc.verify_code, (exc.verify_message or _detail(exc)).rstrip(".")
    if code in _NAME_MISMATCH:
        return TlsError(
            "hostname",
            f"TLS: the broker's certificate does not name {settings.host} ({detail}): put a "
            "name the certificate holds in mqtt.url",
        )
    if code in _EXPIRED:
        return TlsError(
            "expired",
            f"TLS: the broker's certificate is outside its validity period ({detail}): renew "
            "it on the broker, or check this host's clock",
        )
    if settings.ca_file is not None:
        return TlsError(
            "untrusted",
            f"TLS: the broker's certificate is not trusted by mqtt.ca_file {settings.ca_file} "
            f"({detail}): give the CA that signed it",
        )
    return TlsError(
        "untrusted",
        f"TLS: the broker's certificate is not trusted by the system's CA store ({detail}): "
        "set mqtt.ca_file to the CA that signed it",
    )


def reason_text(reason: str) -> str:
    """OpenSSL's reason code as words: ``TLSV13_ALERT_CERTIFICATE_REQUIRED`` → ``tlsv13 alert
    certificate required``."""
    return reason.lower().replace("_", " ")


def _detail(exc: ssl.SSLError) -> str:
    return reason_text(exc.reason) if exc.reason else str(exc)


class BrokerTls:
    """The connection's TLS: a context for each connect and its failures explained, counted."""

    def __init__(self, settings: MqttSettings, metrics: Metrics) -> None:
        self._settings = settings
        self._failures = metrics.counter(
            "mqtt_tls_failures", "TLS connections to the broker that failed", ["reason"]
        )
        if settings.tls:
            for reason in REASONS:  # every series from the start, at 0
                self._failures.labels(reason)

    async def context(self) -> ssl.SSLContext | None:
        """:func:`broker_context`, built on a worker thread (it reads files); a file that
        cannot be used raises :class:`TlsSetupError` (counted)."""
        if not self._settings.tls:
            return None
        try:
            return await asyncio.to_thread(broker_context, self._settings)
        except TlsSetupError as exc:
            self._failures.labels(exc.reason).inc()
            raise

    def failure(self, error: BaseException) -> TlsError | None:
        """:func:`explain`, counted when it is a TLS failure."""
        found = explain(error, self._settings)
        if found is not None:
            self._failures.labels(found.reason).inc()
        return found
