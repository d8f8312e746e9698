"""The OTA endpoint's provisioner: make the broker accept a device's (derived) password, and
make sure it already does before the device is told it.

When the password file already holds a matching hash nothing is written, signalled or polled:
a bound board asking OTA again costs one locked read of the files. Otherwise the user is
created or its hash replaced (``gateway.broker.credentials.ensure_password``) and the broker reloaded.
Mosquitto re-reads its password file on SIGHUP in its own loop, a moment after the signal; a
device that connects within that moment would be refused and (on real firmware) wait about
10 s to retry. So after a change the provisioner probes with an MQTT CONNECT as the device
(distinct client id) until CONNACK 0 or ``verify_s``. Mosquitto clears its reload flag when a
reload ends, so a SIGHUP that arrives during another reload (two boards activating at once) is
lost; while the probe is refused the provisioner signals again every ``_RESIGNAL_S``.
Blocking: the OTA endpoint runs it on its own small executor.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path

from paho.mqtt.client import Client, ConnectFlags
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from gateway.broker.credentials import BrokerFiles, Reloader, ensure_password, revoke
from gateway.broker.io import pid_file_reloader
from gateway.settings import MqttSettings

log = logging.getLogger(__name__)

Provisioner = Callable[[str, str], None]
"""``(dev, password)``: make the broker accept ``password`` for device ``dev`` (blocking,
idempotent; raises when it cannot)."""

_RETRY_GAP_S = 0.02
# A reload takes milliseconds: refused this long after a signal, the signal was lost.
_RESIGNAL_S = 0.5


def unconfigured(dev: str, password: str) -> None:
    """The provisioner of a gateway that may not provision devices (OTA answers 503)."""
    raise RuntimeError("device provisioning is not configured")


def broker_accepts(
    *, host: str, port: int, tls: bool, username: str, password: str, timeout_s: float = 2.0
) -> bool:
    """One MQTT 3.1.1 CONNECT as ``username``; True on CONNACK 0."""
    result: list[ReasonCode] = []

    def on_connect(
        client: Client,
        userdata: object,
        flags: ConnectFlags,
        rc: ReasonCode,
        props: Properties | None,
    ) -> None:
        result.append(rc)

    client = Client(
        CallbackAPIVersion.VERSION2,
        client_id=f"snlpgw-ota-check-{secrets.token_hex(6)}",
        protocol=MQTTProtocolVersion.MQTTv311,
    )
    client.username_pw_set(username, password)
    if tls:
        client.tls_set()
    client.on_connect = on_connect
    try:
        client.connect(host, port, keepalive=10)
        deadline = time.monotonic() + timeout_s
        while not result and time.monotonic() < deadline:
            if client.loop(timeout=0.05) != 0:  # connection closed without a CONNACK
                break
    except OSError:
        return False
    finally:
        client.disconnect()
    return bool(result) and not result[0].is_failure


def broker_provisioner(
    *,
    data_dir: Path,
    mqtt: MqttSettings,
    reload: Reloader | None = None,
    verify_s: float = 3.0,
) -> Provisioner:
    """A :data:`Provisioner` over the gateway's broker files."""
    reloader = reload or pid_file_reloader(BrokerFiles.at(data_dir).pid_file)

    def provision_device(dev: str, password: str) -> None:
        changed = ensure_password(data_dir, dev, password, reload=reloader)
        if not changed or verify_s <= 0:
            return
        deadline = time.monotonic() + verify_s
        signalled = time.monotonic()
        while time.monotonic() < deadline:
            if time.monotonic() - signalled >= _RESIGNAL_S:
                reloader()
                signalled = time.monotonic()
            if broker_accepts(
                host=mqtt.host,
                port=mqtt.port,
                tls=mqtt.tls,
                username=dev,
                password=password,
                timeout_s=max(0.1, deadline - time.monotonic()),
            ):
                return
            threading.Event().wait(_RETRY_GAP_S)  # worker thread: spaces refused attempts
        log.warning("broker did not accept the new password of %s within %.1fs", dev, verify_s)

    return provision_device


def broker_revoker(*, data_dir: Path, reload: Reloader | None = None) -> Callable[[str], bool]:
    """Delete a device's broker user and reload the broker (blocking)."""
    reloader = reload or pid_file_reloader(BrokerFiles.at(data_dir).pid_file)

    def revoke_device(dev: str) -> bool:
        return revoke(data_dir, dev, reload=reloader)

    return revoke_device
