"""Broker credentials on disk: user registry, password file, ACL file, reload hook.

Layout under ``<data_dir>``::

    mosquitto/mosquitto.conf   broker config (`snlpgw broker init`)
    mosquitto/users.json       registry: name → role (never passwords)
    mosquitto/passwd           Mosquitto 2.0 `$7$` hashes of every user, mode 0600
    mosquitto/passwd.gateway   the same without device users (gateway's listener), 0600
    mosquitto/passwd.devices   device users only (device listener), 0600
    mosquitto/acl              generated from the registry, mode 0600
    mosquitto/mosquitto.pid    written by the broker; SIGHUP target for reloads
    mosquitto/data/            broker persistence
    secrets/gateway.password   the gateway's own password (the only stored plaintext), 0600

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
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from gateway.broker_files import (
    GATEWAY_USERNAME,
    GRANTS,
    ConfigPaths,
    CredentialsError,
    Role,
    check_name,
    hash_password,
    parse_passwd,
    render_acl,
    render_config,
    render_passwd,
    verify_password,
)
from gateway.broker_io import (
    Reloader,
    command_reloader,
    locked,
    pid_file_reloader,
    write_atomic,
)

log = logging.getLogger(__name__)

RoleName = Literal["device", "ops", "backend", "gateway"]

__all__ = [
    "BrokerFiles",
    "Credentials",
    "CredentialsError",
    "Reloader",
    "Role",
    "command_reloader",
    "device_listener_port",
    "ensure_password",
    "gateway_password",
    "init_broker_files",
    "local_broker_url",
    "pid_file_reloader",
    "provision",
    "revoke",
]


@dataclass(frozen=True, slots=True)
class BrokerFiles:
    directory: Path
    config: Path
    registry: Path
    password_file: Path
    gateway_listener_passwd: Path
    device_listener_passwd: Path
    acl_file: Path
    pid_file: Path
    persistence_dir: Path
    lock_file: Path
    gateway_password_file: Path

    @classmethod
    def at(cls, data_dir: Path) -> BrokerFiles:
        root = Path(data_dir).absolute()
        d = root / "mosquitto"
        return cls(
            directory=d,
            config=d / "mosquitto.conf",
            registry=d / "users.json",
            password_file=d / "passwd",
            gateway_listener_passwd=d / "passwd.gateway",
            device_listener_passwd=d / "passwd.devices",
            acl_file=d / "acl",
            pid_file=d / "mosquitto.pid",
            persistence_dir=d / "data",
            lock_file=d / ".lock",
            gateway_password_file=root / "secrets" / "gateway.password",
        )

    def config_paths(self) -> ConfigPaths:
        return ConfigPaths(
            password_file=self.password_file,
            acl_file=self.acl_file,
            pid_file=self.pid_file,
            persistence_dir=self.persistence_dir,
            gateway_password_file=self.gateway_listener_passwd,
            device_password_file=self.device_listener_passwd,
        )


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


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Role
    created_ms: int
    rotated_ms: int


class _Registry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: Literal[1] = 1
    users: dict[str, _Entry] = {}


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
    ``broker_files.DEVICE_LISTENER_TEMPLATE``; ``devices_on_gateway_listener`` is for test
    harnesses only)."""
    files = BrokerFiles.at(data_dir)
    with locked(files.lock_file):
        files.persistence_dir.mkdir(parents=True, exist_ok=True)
        registry, hashes = _load(files)
        _ensure_gateway_user(files, registry, hashes)
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
        _store(files, registry, hashes)
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
        registry, hashes = _load(files)
        _ensure_gateway_user(files, registry, hashes)
        existing = registry.users.get(name)
        if existing is not None and existing.role is not role:
            raise CredentialsError(name, f"already registered as {existing.role.value}")
        password: str | None = None
        if existing is None or rotate or name not in hashes:
            password = secrets.token_urlsafe(24)
            now = int(time.time() * 1000)
            created = existing.created_ms if existing else now
            registry.users[name] = _Entry(role=role, created_ms=created, rotated_ms=now)
            hashes[name] = hash_password(password)
            if name == GATEWAY_USERNAME:
                write_atomic(files.gateway_password_file, password + "\n", mode=0o600)
        elif name == GATEWAY_USERNAME:
            password = _read_gateway_password(files)
        _store(files, registry, hashes)
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
        registry, hashes = _load(files)
        existing = registry.users.get(name)
        if existing is not None and existing.role is not role:
            raise CredentialsError(name, f"already registered as {existing.role.value}")
        if existing is not None and verify_password(password, hashes.get(name, "")):
            return False
        _ensure_gateway_user(files, registry, hashes)
        now = int(time.time() * 1000)
        created = existing.created_ms if existing else now
        registry.users[name] = _Entry(role=role, created_ms=created, rotated_ms=now)
        hashes[name] = hash_password(password)
        _store(files, registry, hashes)
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
        registry, hashes = _load(files)
        found = registry.users.pop(name, None) is not None
        hashes.pop(name, None)
        if found:
            _store(files, registry, hashes)
    if found and reload is not None:
        reload()
    return found


def gateway_password(data_dir: Path) -> str:
    return _read_gateway_password(BrokerFiles.at(data_dir))


def local_broker_url(data_dir: Path) -> str | None:
    """``mqtt://host:port`` of the listener in the generated config, if there is one."""
    try:
        text = BrokerFiles.at(data_dir).config.read_text()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == "listener" and words[1].isdigit():
            return f"mqtt://{words[2]}:{words[1]}"
    return None


def device_listener_port(data_dir: Path) -> int | None:
    """Port of the device listener (``use_username_as_clientid``) in the generated config."""
    try:
        text = BrokerFiles.at(data_dir).config.read_text()
    except FileNotFoundError:
        return None
    port: int | None = None
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "listener" and words[1].isdigit():
            port = int(words[1])
        elif words == ["use_username_as_clientid", "true"] and port is not None:
            return port
    return None


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


def _load(files: BrokerFiles) -> tuple[_Registry, dict[str, str]]:
    try:
        registry = _Registry.model_validate_json(files.registry.read_text())
    except FileNotFoundError:
        registry = _Registry()
    except ValidationError as exc:
        # Never "repair" by starting empty: that would lock every device out.
        reason = f"unreadable user registry ({exc.error_count()} errors); fix or restore it"
        raise CredentialsError(str(files.registry), reason) from None
    try:
        hashes = parse_passwd(files.password_file.read_text())
    except FileNotFoundError:
        hashes = {}
    # The registry is authoritative: hashes of unknown users are dropped on the next write.
    return registry, {u: h for u, h in hashes.items() if u in registry.users}


def _store(files: BrokerFiles, registry: _Registry, hashes: dict[str, str]) -> None:
    write_atomic(files.registry, registry.model_dump_json(indent=2) + "\n", mode=0o600)
    roles = {name: entry.role for name, entry in registry.users.items()}
    devices = {u: h for u, h in hashes.items() if roles.get(u) is Role.DEVICE}
    others = {u: h for u, h in hashes.items() if u not in devices}
    # Split files first, the full one last: `_load` reads the full one back.
    write_atomic(files.device_listener_passwd, render_passwd(devices), mode=0o600)
    write_atomic(files.gateway_listener_passwd, render_passwd(others), mode=0o600)
    write_atomic(files.password_file, render_passwd(hashes), mode=0o600)
    write_atomic(files.acl_file, render_acl(roles), mode=0o600)


def _ensure_gateway_user(files: BrokerFiles, registry: _Registry, hashes: dict[str, str]) -> None:
    if GATEWAY_USERNAME in hashes and files.gateway_password_file.exists():
        return
    password = secrets.token_urlsafe(24)
    now = int(time.time() * 1000)
    files.gateway_password_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    registry.users[GATEWAY_USERNAME] = _Entry(role=Role.GATEWAY, created_ms=now, rotated_ms=now)
    hashes[GATEWAY_USERNAME] = hash_password(password)
    write_atomic(files.gateway_password_file, password + "\n", mode=0o600)


def _read_gateway_password(files: BrokerFiles) -> str:
    try:
        return files.gateway_password_file.read_text().strip()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{files.gateway_password_file} missing: run `snlpgw broker init` first"
        ) from None
