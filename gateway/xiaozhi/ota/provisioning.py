"""The OTA endpoint's provisioner: make the broker accept a device's (derived) password, and
make sure it already does before the device is told it.

When the password file already holds a matching hash nothing is written, signalled or polled:
a bound board asking OTA again costs one locked read of the files. Otherwise the user is
created or its hash replaced (``gateway.broker.credentials.ensure_password``) and the broker reloaded.
Mosquitto re-reads its password file on SIGHUP in its own loop, a moment after the signal; a
device that connects within that moment would be refused and (on real firmware) wait about
10 s to retry. So after a change the provisioner connects as the device where boards are sent
(:func:`device_endpoint`: on a split broker the gateway's listener admits no device user)
until CONNACK 0 or ``verify_s``, signalling again while refused: Mosquitto clears its reload
flag when a reload ends, so a SIGHUP that lands during another reload (two boards activating
at once) is lost (:func:`gateway.mqtt.probe.await_login`). Blocking: the OTA endpoint runs it on
its own small executor.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from gateway.broker.credentials import (
    BrokerFiles,
    Reloader,
    device_listener_port,
    ensure_password,
    revoke,
)
from gateway.broker.io import pid_file_reloader
from gateway.mqtt.probe import RESIGNAL_S, await_login
from gateway.settings import Settings

log = logging.getLogger(__name__)

Provisioner = Callable[[str, str], None]
"""``(dev, password)``: make the broker accept ``password`` for device ``dev`` (blocking,
idempotent; raises when it cannot)."""

_FIRMWARE_TLS_PORT = 8883


def unconfigured(dev: str, password: str) -> None:
    """The provisioner of a gateway that may not provision devices (OTA answers 503)."""
    raise RuntimeError("device provisioning is not configured")


def device_endpoint(settings: Settings) -> tuple[str, int, bool]:
    """(host, port, tls) boards are sent to: the OTA endpoint (TLS exactly on 8883, as the
    firmware does; 8883 when it names no port), else the generated config's device listener,
    else the gateway's broker."""
    if settings.xiaozhi.ota_mqtt_endpoint:
        host, port = split_endpoint(settings.xiaozhi.ota_mqtt_endpoint)
        return host, port, port == _FIRMWARE_TLS_PORT
    mqtt = settings.mqtt  # wire.mqtt_endpoint's default, as (host, port)
    return mqtt.host, device_listener_port(settings.data_dir) or mqtt.port, mqtt.tls


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or a bare host (the firmware's default port then, 8883)."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit() or (host.startswith("[") and not host.endswith("]")):
        host, port = endpoint, str(_FIRMWARE_TLS_PORT)
    return host.removeprefix("[").removesuffix("]"), int(port)


def broker_provisioner(
    settings: Settings, *, reload: Reloader | None = None, verify_s: float = 3.0
) -> Provisioner:
    """A :data:`Provisioner` over the broker files under ``settings.data_dir``."""
    data_dir = settings.data_dir
    reloader = reload or pid_file_reloader(BrokerFiles.at(data_dir).pid_file)

    def provision_device(dev: str, password: str) -> None:
        changed = ensure_password(data_dir, dev, password, reload=reloader)
        if not changed or verify_s <= 0:
            return
        # Where the board will log in. On a device listener the client id is the user name, so
        # this login displaces a session of the board's own: the reload already ended one on
        # the old password, and the board learns the new one from an OTA answer (one that
        # asked twice may connect from the second answer while this still probes: displaced
        # once, it reconnects).
        host, port, tls = device_endpoint(settings)
        answer = await_login(host, port, dev, password, within_s=verify_s, tls=tls, reload=reloader)
        if answer is None:
            log.warning("could not reach the broker at %s:%d to confirm %s", host, port, dev)
        elif answer != 0:
            log.warning("broker did not accept the new password of %s within %.1fs", dev, verify_s)

    return provision_device


class _SignalAgain:
    """One more reload signal :data:`RESIGNAL_S` after a revoke, on a timer thread (the OTA
    workers are not held); revokes meanwhile share it. A revoke has no password to probe the
    broker with, and a first signal lost during another reload would leave a forgotten device
    able to log in until some later reload."""

    def __init__(self, reload: Reloader, delay_s: float) -> None:
        self._reload = reload
        self._delay_s = delay_s
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def __call__(self) -> None:
        with self._lock:
            if self._timer is not None:
                return
            self._timer = threading.Timer(self._delay_s, self._fire)
            self._timer.daemon = True
            self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            self._timer = None
        try:
            self._reload()
        except Exception:
            log.exception("signalling the broker again after a revoke failed")


def broker_revoker(
    *, data_dir: Path, reload: Reloader | None = None, resignal_s: float = RESIGNAL_S
) -> Callable[[str], bool]:
    """Delete a device's broker user and reload the broker (blocking), signalling once more
    ``resignal_s`` later (:class:`_SignalAgain`)."""
    reloader = reload or pid_file_reloader(BrokerFiles.at(data_dir).pid_file)
    again = _SignalAgain(reloader, resignal_s)

    def revoke_device(dev: str) -> bool:
        removed = revoke(data_dir, dev, reload=reloader)
        if removed:
            again()
        return removed

    return revoke_device
