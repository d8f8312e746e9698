"""Broker credentials on disk: create, rotate, set and revoke users; reload the broker.

Files and layout: :mod:`gateway.broker.layout`; registry: :mod:`gateway.broker.registry`.
Hashes are written here rather than by ``mosquitto_passwd -b``: the password file is then
rewritten whole and atomically (tmp + rename) under one lock, no client binary is needed where
the gateway runs, and compatibility is proven by the real-broker tests (and a unit test that
verifies a ``mosquitto_passwd`` hash with our code). Writers are serialized by ``flock`` on
``mosquitto/.lock`` (threads and processes alike: OTA requests may race the CLI).
Blocking: call from a worker thread (``asyncio.to_thread``) inside the event loop.
"""

from __future__ import annotations

import logging
import os
import pwd
import secrets
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from gateway.broker import registry as reg
from gateway.broker.io import (
    Reloader,
    command_reloader,
    locked,
    pid_file_reloader,
    write_atomic,
)
from gateway.broker.layout import BrokerFiles, device_listener_port, local_broker_url
from gateway.broker.rules import (
    GATEWAY_USERNAME,
    GRANTS,
    CredentialsError,
    Role,
    check_name,
    hash_password,
    render_config,
    verify_password,
)

if TYPE_CHECKING:
    from gateway.settings import Settings

log = logging.getLogger(__name__)

RoleName = Literal["device", "ops", "backend", "gateway"]

__all__ = [
    "BrokerFiles",
    "Credentials",
    "CredentialsError",
    "GatewaySecret",
    "Reloader",
    "Role",
    "command_reloader",
    "device_listener_port",
    "ensure_password",
    "gateway_mqtt_password",
    "gateway_password",
    "gateway_secret",
    "init_broker_files",
    "local_broker_url",
    "pid_file_reloader",
    "provision",
    "revoke",
]


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str
    password: str | None = field(repr=False)  # None: existing user kept (rotate=False)
    role: Role
    client_id: str | None  # devices only: a suggestion in the Xiaozhi GID_ format
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]

    def as_dict(self, *, broker_url: str | None = None) -> dict[str, object]:
        out: dict[str, object] = {
            "username": self.username,
            "password": self.password,
            "role": self.role.value,
            "client_id": self.client_id,
            "topics": {"publish": list(self.publish), "subscribe": list(self.subscribe)},
        }
        if broker_url is not None:
            out["broker_url"] = broker_url
        return out


# -- public API --------------------------------------------------------------------------------


def init_broker_files(
    data_dir: Path,
    *,
    listener_host: str = "127.0.0.1",
    listener_port: int = 1883,
    device_port: int | None = None,
    devices_on_gateway_listener: bool = False,
) -> BrokerFiles:
    """Create or refresh every broker file; idempotent (existing users and hashes are kept).

    ``device_port``: also listen there (on ``listener_host``) for devices, with client ids
    forced to user names; the first listener then admits no device user (see
    ``gateway.broker.rules.DEVICE_LISTENER_TEMPLATE``; ``devices_on_gateway_listener`` is for test
    harnesses only)."""
    files = BrokerFiles.at(data_dir)
    with locked(files.lock_file):
        files.persistence_dir.mkdir(parents=True, exist_ok=True)
        registry, hashes = reg.load(files)
        reg.ensure_gateway_user(files, registry, hashes)
        write_atomic(
            files.config,
            render_config(
                files.config_paths(),
                listener_host=listener_host,
                listener_port=listener_port,
                run_as=_effective_user(),
                device_listener=None if device_port is None else (listener_host, device_port),
                devices_on_gateway_listener=devices_on_gateway_listener,
            ),
            mode=0o644,
        )
        reg.store(files, registry, hashes)
    return files


def provision(
    data_dir: Path,
    name: str,
    *,
    role: Role | RoleName = "device",
    rotate: bool = True,
    reload: Reloader | None,
) -> Credentials:
    """Create ``name`` (or give it a fresh password) and reload the broker.

    ``rotate=False`` keeps an existing user's password; the returned ``password`` is then None
    (hashes cannot be reversed), except for the gateway user whose password is stored.
    """
    role = Role(role)
    check_name(name, role)
    files = BrokerFiles.at(data_dir)
    with locked(files.lock_file):
        registry, hashes = reg.load(files)
        reg.ensure_gateway_user(files, registry, hashes)
        existing = registry.users.get(name)
        if existing is not None and existing.role is not role:
            raise CredentialsError(name, f"already registered as {existing.role.value}")
        password: str | None = None
        if existing is None or rotate or name not in hashes:
            password = secrets.token_urlsafe(24)
            registry.set_user(name, role)
            hashes[name] = hash_password(password)
            if name == GATEWAY_USERNAME:
                write_atomic(files.gateway_password_file, password + "\n", mode=0o600)
        elif name == GATEWAY_USERNAME:
            password = reg.read_gateway_password(files)
        reg.store(files, registry, hashes)
    log.info("broker user %s (%s) %s", name, role.value, "set" if password else "kept")
    if reload is not None:
        reload()
    return _credentials(name, role, password)


def ensure_password(
    data_dir: Path, name: str, password: str, *, role: Role = Role.DEVICE, reload: Reloader | None
) -> bool:
    """Make ``password`` the password of ``name`` (created if missing). Returns False, having
    written nothing, when the stored hash already matches; True after writing and reloading."""
    check_name(name, role)
    files = BrokerFiles.at(data_dir)
    with locked(files.lock_file):
        registry, hashes = reg.load(files)
        existing = registry.users.get(name)
        if existing is not None and existing.role is not role:
            raise CredentialsError(name, f"already registered as {existing.role.value}")
        if existing is not None and verify_password(password, hashes.get(name, "")):
            return False
        reg.ensure_gateway_user(files, registry, hashes)
        registry.set_user(name, role)
        hashes[name] = hash_password(password)
        reg.store(files, registry, hashes)
    log.info("broker user %s (%s) set", name, role.value)
    if reload is not None:
        reload()
    return True


def revoke(data_dir: Path, name: str, *, reload: Reloader | None) -> bool:
    """Remove a user; returns False when it did not exist. The gateway user stays."""
    if name == GATEWAY_USERNAME:
        raise CredentialsError(name, "the gateway user cannot be revoked")
    files = BrokerFiles.at(data_dir)
    with locked(files.lock_file):
        registry, hashes = reg.load(files)
        found = registry.users.pop(name, None) is not None
        hashes.pop(name, None)
        if found:
            reg.store(files, registry, hashes)
    if found and reload is not None:
        reload()
    return found


def gateway_password(data_dir: Path) -> str:
    """The password ``snlpgw broker init`` wrote for the gateway user under ``data_dir``."""
    return reg.read_gateway_password(BrokerFiles.at(data_dir))


@dataclass(frozen=True, slots=True)
class GatewaySecret:
    """The gateway's broker password as the settings resolve it (:func:`gateway_secret`):
    ``source`` says where it came from (or was looked for); ``problem``, when there is none,
    says why and which setting to fix. Never logged with the password."""

    password: str | None = field(repr=False)
    source: str
    problem: str | None = None


_FIX = (
    "set mqtt.password_file (SNLPGW_MQTT__PASSWORD_FILE) to the broker's "
    "<data_dir>/secrets/gateway.password, or mqtt.password"
)


def gateway_secret(settings: Settings) -> GatewaySecret:
    """The password the gateway connects with, first found: ``mqtt.password``, then the file
    ``mqtt.password_file`` (when set, the only place looked at), then
    ``<data_dir>/secrets/gateway.password`` (what ``snlpgw broker init`` wrote there)."""
    mqtt = settings.mqtt
    if mqtt.password is not None:
        return GatewaySecret(mqtt.password, "mqtt.password")
    if mqtt.password_file is not None:
        return _read_secret(Path(mqtt.password_file), f"mqtt.password_file {mqtt.password_file}")
    default = BrokerFiles.at(Path(settings.data_dir)).gateway_password_file
    found = _read_secret(default, str(default))
    if found.password is None:
        unset = "mqtt.password and mqtt.password_file unset"
        return GatewaySecret(None, found.source, f"{unset}, {found.problem}: {_FIX}")
    return found


def _read_secret(path: Path, source: str) -> GatewaySecret:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return GatewaySecret(None, source, f"{source} missing")
    except OSError as exc:
        return GatewaySecret(None, source, f"{source} unreadable ({exc.strerror or exc})")
    if not text:
        return GatewaySecret(None, source, f"{source} is empty")
    return GatewaySecret(text, source)


def gateway_mqtt_password(settings: Settings) -> str | None:
    """The password the gateway connects with (:func:`gateway_secret`); None if there is none
    (the service and the doctor say why)."""
    return gateway_secret(settings).password


# -- internals ---------------------------------------------------------------------------------


def _credentials(name: str, role: Role, password: str | None) -> Credentials:
    grants = GRANTS[role].for_user(name)
    client_id = f"GID_snlp@@@{name}@@@{uuid.uuid4()}" if role is Role.DEVICE else None
    return Credentials(
        username=name,
        password=password,
        role=role,
        client_id=client_id,
        publish=grants.readwrite + grants.publish,
        subscribe=grants.readwrite + grants.subscribe,
    )


def _effective_user() -> str | None:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return None
