"""Doctor checks against the running system: broker, gateway HTTP listeners, UDP audio port."""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import socket
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gateway.broker.credentials import gateway_secret
from gateway.doctor.report import Row, fail, ok, skip
from gateway.mqtt import codec
from gateway.mqtt.probe import connack
from gateway.mqtt.tls import broker_context, explain
from gateway.settings import MqttSettings, Settings

TIMEOUT_S = 3.0
SEEN_WITHIN_S = 3.0
_CONNACK_MEANING = {
    134: "bad user name or password",
    135: "not authorised (wrong password?)",
    133: "client id not valid",
    136: "server unavailable",
}
_DROPS = re.compile(r"^snlpgw_xiaozhi_udp_dropped_total\{[^}]*\} ([0-9.e+]+)$", re.MULTILINE)


@dataclass
class Findings:
    """What later checks need from earlier ones."""

    broker_up: bool = False
    gateway_login: bool = False
    server_date: str | None = None
    server_date_seen: datetime | None = None  # our clock when that Date arrived
    metrics_text: str | None = None
    notes: list[str] = field(default_factory=list)


def local(host: str) -> str:
    """Where to reach a listener bound to ``host`` (a wildcard bind answers on loopback)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)  # noqa: S104


def check_secret(settings: Settings) -> Row:
    """Where the gateway's broker password comes from, or why there is none and which
    setting to fix (a gateway without one retries a refused login: nothing else says so)."""
    secret = gateway_secret(settings)
    if secret.password is None:
        return fail("gateway secret", secret.problem or secret.source)
    return ok("gateway secret", f"from {secret.source}")


def check_broker(settings: Settings, found: Findings) -> list[Row]:
    """TCP to ``mqtt.url`` (mqtts: TLS with the gateway's own context, ``mqtt.ca_file`` and
    client certificate, a TLS failure said as the setting to fix); then the gateway's login."""
    mqtt = settings.mqtt
    where = f"{mqtt.host}:{mqtt.port}"
    password = gateway_secret(settings).password
    try:
        context = broker_context(mqtt)  # an unusable file: TlsSetupError, an OSError
        with socket.create_connection((mqtt.host, mqtt.port), timeout=TIMEOUT_S) as sock:
            if context is not None:
                _tls_answer(context, sock, mqtt, password)
    except OSError as exc:
        tls_error = explain(exc, mqtt)
        reason = str(tls_error) if tls_error else exc.strerror or str(exc) or type(exc).__name__
        return [
            fail("broker reachable", f"{where}: {reason}"),
            skip("broker credentials", "broker unreachable"),
        ]
    found.broker_up = True
    rows = [ok("broker reachable", f"{where} accepts {'TLS' if mqtt.tls else 'TCP'}")]
    if password is None:
        rows.append(skip("broker credentials", "no gateway password (see gateway secret)"))
        return rows
    code = connack(mqtt.host, mqtt.port, mqtt.username, password, context=context, timeout_s=5)
    if code == 0:
        found.gateway_login = True
        rows.append(ok("broker credentials", f"user {mqtt.username} logged in"))
    elif code is None:
        rows.append(fail("broker credentials", "no CONNACK from the broker"))
    else:
        meaning = _CONNACK_MEANING.get(code, "refused")
        rows.append(fail("broker credentials", f"user {mqtt.username}: {meaning} ({code})"))
    return rows


def _tls_answer(
    context: ssl.SSLContext, sock: socket.socket, mqtt: MqttSettings, password: str | None
) -> None:
    """The TLS handshake, then a CONNECT and the first byte of the broker's answer: a TLS 1.3
    broker refuses a client certificate (or its absence) only after the handshake, with an
    alert that arrives instead of the CONNACK (raised here as an ``ssl.SSLError``)."""
    with context.wrap_socket(sock, server_hostname=mqtt.host) as tls:
        hello = codec.connect(
            client_id=f"snlpgw-doctor-{secrets.token_hex(6)}",
            keepalive_s=10,
            username=mqtt.username,
            password=password,
        )
        with contextlib.suppress(OSError):  # closed on us: the read below raises why
            tls.sendall(hello)
        with contextlib.suppress(TimeoutError):  # no answer: the credentials row says more
            tls.recv(1)


def _get(url: str, token: str | None = None) -> tuple[int, str, str | None]:
    request = urllib.request.Request(url)  # noqa: S310 - http(s) URL built from settings
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:  # noqa: S310
            return resp.status, resp.read().decode(errors="replace"), resp.headers.get("Date")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace"), exc.headers.get("Date")


def check_gateway_http(settings: Settings, found: Findings) -> list[Row]:
    http = settings.http
    health = f"http://{local(http.host)}:{http.port}/healthz"
    try:
        status, body, found.server_date = _get(health)
        found.server_date_seen = datetime.now(UTC)
    except OSError as exc:
        row = fail("gateway health", f"{health}: {getattr(exc, 'reason', exc)}")
    else:
        row = (ok if status == 200 else fail)("gateway health", f"{health}: {status} {body[:120]}")
    metrics = f"http://{local(http.admin_host)}:{http.admin_port}/metrics"
    token = http.admin_token.get_secret_value() if http.admin_token else None
    try:
        status, body, _ = _get(metrics, token)
    except OSError as exc:
        return [row, fail("admin metrics", f"{metrics}: {getattr(exc, 'reason', exc)}")]
    if status != 200:
        hint = " (set http.admin_token as the gateway has it)" if status == 401 else ""
        return [row, fail("admin metrics", f"{metrics}: HTTP {status}{hint}")]
    found.metrics_text = body
    rows = [row, ok("admin metrics", f"{metrics}: {body.count(chr(10))} lines")]
    return [*rows, _subscriptions(f"http://{local(http.admin_host)}:{http.admin_port}", token)]


def _subscriptions(admin: str, token: str | None) -> Row:
    """The gateway's broker subscriptions, from the admin /healthz's ``mqtt`` detail: a filter
    the broker refused (its ACL) leaves the gateway deaf on it."""
    try:
        _, body, _ = _get(f"{admin}/healthz", token)
        detail = json.loads(body).get("mqtt", {})
    except (OSError, ValueError, AttributeError) as exc:
        return skip("broker subscriptions", f"{admin}/healthz unreadable: {exc}")
    refused = detail.get("refused_subscriptions") if isinstance(detail, dict) else None
    if refused:
        named = ", ".join(str(f) for f in refused)
        return fail(
            "broker subscriptions",
            f"refused by the broker: {named} (the gateway hears nothing there; check the ACL)",
        )
    return ok("broker subscriptions", "every route granted")


def _udp_drops(text: str | None) -> float | None:
    if text is None:
        return None
    return sum(float(v) for v in _DROPS.findall(text))


def check_udp(settings: Settings, found: Findings) -> Row:
    """One junk datagram: refused (ICMP) means nothing is bound; the gateway counts it as a drop."""
    udp, http = settings.udp, settings.http
    host = local(udp.host)
    before = _udp_drops(found.metrics_text)
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(0.5)
        s.connect((host, udp.port))
        try:
            s.send(b"\x00snlpgw-doctor")  # not a Xiaozhi packet: dropped as malformed
            s.recv(2048)
        except ConnectionRefusedError:
            return fail("UDP audio port", f"{host}:{udp.port}: nothing bound (port unreachable)")
        except TimeoutError:
            pass  # no reply and no ICMP error: something is bound
    if before is None:
        return ok(
            "UDP audio port",
            f"{host}:{udp.port} bound (admin metrics unreadable: owner unconfirmed)",
        )
    token = http.admin_token.get_secret_value() if http.admin_token else None
    url = f"http://{local(http.admin_host)}:{http.admin_port}/metrics"
    deadline = time.monotonic() + SEEN_WITHIN_S
    while time.monotonic() < deadline:  # the count is the event waited for; bounded polling
        with contextlib.suppress(OSError):
            after = _udp_drops(_get(url, token)[1])
            if after is not None and after > before:
                return ok("UDP audio port", f"{host}:{udp.port}: the gateway counted the probe")
        time.sleep(0.1)
    return fail(
        "UDP audio port", f"{host}:{udp.port} bound, but the gateway did not count the probe"
    )
