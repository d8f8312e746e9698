"""Synchronous broker probes (no threads): used by ``snlpgw dev-run``, ``snlpgw doctor``,
``snlpgw provision``, the OTA provisioner (on its worker threads) and the dev stack
(``devstack/``: demo, tests, benchmarks) — the one MQTT CONNECT probe, and
:func:`await_login`, the one loop that waits for a credentials change to take effect.

paho's network loop is driven by hand (``loop()``), so no thread is started: ``dev-run`` keeps
its signals blocked for ``sigtimedwait`` and forks children, which threads would complicate.
"""

from __future__ import annotations

import contextlib
import secrets
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paho.mqtt.client import Client, MQTTMessage
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from gateway.mqtt.tls import client_context


class Probe:
    """One MQTT 5 client with a hand-driven loop; ``connack`` is None until answered."""

    def __init__(
        self,
        host: str,
        port: int,
        username: str | None,
        password: str | None,
        *,
        tls: bool = False,
        ca_file: Path | None = None,
        context: ssl.SSLContext | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.connack: int | None = None
        self.closed = False
        self.granted: dict[int, list[int]] = {}  # mid -> SUBACK reason codes
        self.received: list[MQTTMessage] = []
        self.client = Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"snlpgw-probe-{secrets.token_hex(6)}",  # the broker refuses empty ids
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        if username is not None:
            self.client.username_pw_set(username, password)
        # TLS: ``context`` as given (the gateway's: gateway.mqtt.tls.broker_context), else one
        # trusting ca_file instead of the system's CAs.
        if context is None and (tls or ca_file is not None):
            context = client_context(ca_file=ca_file)
        if context is not None:
            self.client.tls_set_context(context)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = lambda _c, _u, msg: self.received.append(msg)

    def _on_connect(self, _c: Client, _u: object, _f: object, rc: Any, _p: object) -> None:
        self.connack = int(rc.value)

    def _on_disconnect(self, *_: object) -> None:
        self.closed = True

    def _on_subscribe(self, _c: Client, _u: object, mid: int, codes: Any, _p: object) -> None:
        self.granted[mid] = [int(code.value) for code in codes]

    def connect(self, timeout_s: float) -> int | None:
        """CONNACK reason code (0 = accepted); None when the broker never answered."""
        self.client.connect(self.host, self.port, keepalive=10)  # OSError: nobody listening
        self.pump_until(lambda: self.connack is not None or self.closed, timeout_s)
        return self.connack

    def pump_until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Drive the network loop until ``done()`` or the timeout; returns ``done()``."""
        deadline = time.monotonic() + timeout_s
        while not done() and not self.closed and time.monotonic() < deadline:
            self.client.loop(timeout=0.05)
        return done()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.disconnect()
            self.client.loop(timeout=0.05)
        sock = self.client.socket()  # still open when the broker never answered
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()


def connack(
    host: str,
    port: int,
    username: str | None,
    password: str | None,
    *,
    tls: bool = False,
    ca_file: Path | None = None,
    context: ssl.SSLContext | None = None,
    timeout_s: float = 5.0,
) -> int | None:
    """Connect once and disconnect: the CONNACK reason code (0 = accepted), None when nobody
    answered (refused socket, failed TLS handshake, closed without a CONNACK). TLS as
    :class:`Probe` takes it."""
    probe = Probe(host, port, username, password, tls=tls, ca_file=ca_file, context=context)
    try:
        return probe.connect(timeout_s)
    except OSError:
        return None
    finally:
        probe.close()


# Mosquitto clears its reload flag when a reload ends, so a SIGHUP that lands during another
# reload is lost. A reload takes milliseconds: still the old answer this long after a signal,
# the signal was lost and is sent again.
RESIGNAL_S = 0.5


def await_login(
    host: str,
    port: int,
    username: str | None,
    password: str | None,
    *,
    within_s: float,
    accepted: bool = True,
    tls: bool = False,
    ca_file: Path | None = None,
    context: ssl.SSLContext | None = None,
    reload: Callable[[], None] | None = None,
    alive: Callable[[], None] | None = None,
    gap_s: float = 0.02,
) -> int | None:
    """After a credentials change and its reload signal: connect as ``username`` until the
    broker answers as the reload makes it (CONNACK 0 when ``accepted``, a refusal otherwise)
    or ``within_s`` passed (plus one probe's connect); ``reload`` is signalled again each
    :data:`RESIGNAL_S` of the old answer (not while nobody answers: that is no lost reload),
    ``alive`` may raise to stop early (a broker that exited). The last answer (None: nobody
    answered)."""
    deadline = time.monotonic() + within_s
    signalled = time.monotonic()
    answer: int | None = None
    while True:
        if alive is not None:
            alive()
        remaining = deadline - time.monotonic()
        answer = connack(
            host, port, username, password, tls=tls, ca_file=ca_file, context=context,
            timeout_s=max(0.1, min(2.0, remaining)),
        )  # fmt: skip
        if answer is not None and (answer == 0) == accepted:
            return answer
        if time.monotonic() >= deadline:
            return answer
        if answer is not None and reload is not None and time.monotonic() - signalled >= RESIGNAL_S:
            reload()
            signalled = time.monotonic()
        time.sleep(gap_s)  # spaces attempts; a connect attempt is the wait itself
