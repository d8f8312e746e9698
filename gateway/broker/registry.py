"""The user registry (``users.json``: name → role, never passwords) and the files it implies.

The registry is authoritative: the password files and the ACL are rewritten whole from it and
the hashes on every write. Callers hold the writers' lock (:func:`gateway.broker.io.locked`).
"""

from __future__ import annotations

import secrets
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from gateway.broker.io import write_atomic
from gateway.broker.layout import BrokerFiles
from gateway.broker.rules import (
    GATEWAY_USERNAME,
    CredentialsError,
    Role,
    hash_password,
    parse_passwd,
    render_acl,
    render_passwd,
)


class RegisteredUser(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Role
    created_ms: int
    rotated_ms: int


class UserRegistry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: Literal[1] = 1
    users: dict[str, RegisteredUser] = {}

    def set_user(self, name: str, role: Role) -> None:
        """Register ``name`` (or mark its password rotated now), keeping its creation time."""
        now = int(time.time() * 1000)
        existing = self.users.get(name)
        created = existing.created_ms if existing else now
        self.users[name] = RegisteredUser(role=role, created_ms=created, rotated_ms=now)


def load(files: BrokerFiles) -> tuple[UserRegistry, dict[str, str]]:
    try:
        registry = UserRegistry.model_validate_json(files.registry.read_text())
    except FileNotFoundError:
        registry = UserRegistry()
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


def store(files: BrokerFiles, registry: UserRegistry, hashes: dict[str, str]) -> None:
    write_atomic(files.registry, registry.model_dump_json(indent=2) + "\n", mode=0o600)
    roles = {name: entry.role for name, entry in registry.users.items()}
    devices = {u: h for u, h in hashes.items() if roles.get(u) is Role.DEVICE}
    others = {u: h for u, h in hashes.items() if u not in devices}
    # The ACL before any password file: one Mosquitto reload reads the password files, then
    # the ACL, so a reload that runs between these writes and lets a new user in has its ACL
    # lines too. (The other order let a user in with none: subscriptions refused, messages to
    # it dropped, until some later reload.) Removing a role user, the same window lets it in
    # for one reload with no lines of its own, i.e. only the device patterns for its own name
    # (topics no device has): harmless, and our own signal follows the writes. Split files
    # next, the full one last: `load` reads the full one back.
    write_atomic(files.acl_file, render_acl(roles), mode=0o600)
    write_atomic(files.device_listener_passwd, render_passwd(devices), mode=0o600)
    write_atomic(files.gateway_listener_passwd, render_passwd(others), mode=0o600)
    write_atomic(files.password_file, render_passwd(hashes), mode=0o600)


def ensure_gateway_user(files: BrokerFiles, registry: UserRegistry, hashes: dict[str, str]) -> None:
    if GATEWAY_USERNAME in hashes and files.gateway_password_file.exists():
        return
    password = secrets.token_urlsafe(24)
    now = int(time.time() * 1000)
    files.gateway_password_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    registry.users[GATEWAY_USERNAME] = RegisteredUser(
        role=Role.GATEWAY, created_ms=now, rotated_ms=now
    )
    hashes[GATEWAY_USERNAME] = hash_password(password)
    write_atomic(files.gateway_password_file, password + "\n", mode=0o600)


def read_gateway_password(files: BrokerFiles) -> str:
    try:
        return files.gateway_password_file.read_text().strip()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{files.gateway_password_file} missing: run `snlpgw broker init` first"
        ) from None
