"""What the OTA trust model keeps on disk, and the device password derivation.

Layout under ``<data_dir>``::

    xiaozhi/bindings.json   MAC → {client_id, generation}, mode 0600, rewritten atomically
    secrets/ota.key         32 random bytes (hex), mode 0600: the device password key

**Device passwords are derived, not stored**: ``password(dev, client, g)`` = base64url of
HMAC-SHA256(ota.key, ``"snlpgw-device-password/v2|" + dev + "|" + client + "|" + g``), 32
characters, ``client`` being the binding's Client-Id (a MAC that is forgotten and bound again
by another Client-Id restarts at ``g = 1`` but never with a password seen before). The
broker's password file keeps only its PBKDF2 hash, as for every user; the gateway recomputes
the password to answer the bound board's next OTA request, so answering it again rotates
nothing and writes nothing. Rotating means moving to generation ``g + 1`` (a newly approved
Client-Id, or ``snlpgw device rotate``). The key is the one secret to protect: whoever reads it
can compute every device's password (like reading ``secrets/gateway.password``).

Operator inputs: the allowlist (``xiaozhi.ota_allowlist`` MACs and/or a file, one MAC a line,
``#`` comments) and the HMAC keys of boards with an efuse serial number (a JSON object
``{"<serial>": "<64 hex chars>"}``, the 32-byte key burnt into the board's HMAC_KEY0).
Blocking file I/O: the OTA endpoint calls these on its own executor.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.broker.io import write_atomic
from gateway.settings import Settings
from gateway.xiaozhi.ota.trust import Binding, Policy, TrustBook, TrustConfig
from gateway.xiaozhi.ota.wire import OtaRefused, device_id_from_mac

_KEY_BYTES = 32


class TrustFileError(ValueError):
    """An operator file or the bindings file cannot be used (the gateway refuses to start)."""


class _StoredBinding(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    client_id: str
    generation: int = Field(ge=1)
    serial: str | None = None


class _BindingsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = 1
    devices: dict[str, _StoredBinding] = {}


def bindings_path(data_dir: Path) -> Path:
    return Path(data_dir) / "xiaozhi" / "bindings.json"


def load_bindings(path: Path) -> dict[str, Binding]:
    """Missing file → no bindings. An unreadable one is an error, never "start empty": that
    would let the next caller bind every known MAC to itself."""
    try:
        parsed = _BindingsFile.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except ValidationError as exc:
        raise TrustFileError(f"{path}: unreadable ({exc.error_count()} errors)") from None
    return {dev: Binding(e.client_id, e.generation, e.serial) for dev, e in parsed.devices.items()}


def save_bindings(path: Path, bindings: dict[str, Binding]) -> None:
    entries = {
        dev: _StoredBinding(client_id=b.client_id, generation=b.generation, serial=b.serial)
        for dev, b in bindings.items()
    }
    doc = _BindingsFile(devices=entries)
    write_atomic(path, doc.model_dump_json(indent=1) + "\n", mode=0o600)


def device_key(data_dir: Path) -> bytes:
    """``secrets/ota.key``, created (0600, exclusively) on first use."""
    path = Path(data_dir) / "secrets" / "ota.key"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(_KEY_BYTES) + "\n")
    try:
        key = bytes.fromhex(path.read_text().strip())
    except ValueError:
        raise TrustFileError(f"{path}: not a hex key") from None
    if len(key) < 16:
        raise TrustFileError(f"{path}: key too short")
    return key


def device_password(key: bytes, dev: str, client_id: str, generation: int) -> str:
    message = f"snlpgw-device-password/v2|{dev}|{client_id}|{generation}".encode()
    digest = hmac.new(key, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode()[:32]


def load_allowlist(macs: Iterable[str], path: Path | None) -> frozenset[str]:
    """Device ids from the setting's MACs and the file's lines (``aa:bb:..`` or ``aa_bb_..``)."""
    lines = list(macs)
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise TrustFileError(f"allowlist {path}: {exc.strerror}") from None
        lines += [line.split("#", 1)[0] for line in text.splitlines()]
    devices: set[str] = set()
    for raw in lines:
        mac = raw.strip().replace("_", ":")
        if not mac:
            continue
        try:
            devices.add(device_id_from_mac(mac))
        except OtaRefused as exc:
            raise TrustFileError(f"allowlist entry {raw.strip()!r}: {exc}") from None
    return frozenset(devices)


@dataclass(frozen=True, slots=True)
class HmacKey:
    key: bytes = field(repr=False)
    dev: str | None  # pinned MAC: the serial is only believed from this device


def load_hmac_keys(path: Path | None) -> dict[str, HmacKey]:
    """``{"<serial>": "<hex key>"}`` or ``{"<serial>": {"key": "<hex>", "mac": "<MAC>"}}``."""
    if path is None:
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TrustFileError(f"HMAC keys {path}: {exc.strerror}") from None
    except ValueError:
        raise TrustFileError(f"HMAC keys {path}: not JSON") from None
    if not isinstance(doc, dict):
        raise TrustFileError(f"HMAC keys {path}: expected {{serial: hex key}}")
    return {serial: _hmac_key(path, serial, entry) for serial, entry in doc.items()}


def _hmac_key(path: Path, serial: str, entry: object) -> HmacKey:
    spec = entry if isinstance(entry, dict) else {"key": entry}
    hex_key, mac = spec.get("key"), spec.get("mac")
    dev: str | None = None
    try:
        key = bytes.fromhex(hex_key) if isinstance(hex_key, str) else b""
        dev = device_id_from_mac(mac.replace("_", ":")) if isinstance(mac, str) else None
    except (ValueError, OtaRefused):
        key = b""
    if len(key) < 16 or (mac is not None and dev is None):
        raise TrustFileError(f"HMAC keys {path}: entry of {serial!r} needs a >= 16-byte hex key")
    return HmacKey(key, dev)


def trust_book_from(settings: Settings, data_dir: Path) -> TrustBook:
    """The trust book with the persisted bindings and the operator's allowlist (blocking)."""
    x = settings.xiaozhi
    config = TrustConfig(
        policy=Policy(x.ota_policy),
        allowlist=load_allowlist(x.ota_allowlist, x.ota_allowlist_file),
        code_ttl_s=x.ota_code_ttl_s,
        max_pending=x.ota_max_pending,
        users_per_hour=x.ota_users_per_hour,
        max_devices=x.ota_max_devices,
    )
    return TrustBook(
        config,
        bindings=load_bindings(bindings_path(data_dir)),
        new_code=lambda: f"{secrets.randbelow(1_000_000):06d}",
        new_challenge=lambda: secrets.token_hex(16),
    )
