"""Who a device is to the xiaozhi server, and what proves it: read from the gateway's files.

**Identity** (what the firmware sends on its own WebSocket, ``websocket_protocol.cc``):
``Device-Id`` is the MAC (``aa:bb:..``, the device id with colons) and ``Client-Id`` the board's
UUID (NVS ``uuid``). The gateway learns the UUID from the device's OTA binding
(``<data_dir>/xiaozhi/bindings.json``, ``{dev: {client_id, ...}}``): the OTA endpoint binds a MAC
to the ``Client-Id`` header of its request and issues the MQTT client id
``GID_<board>@@@{dev}@@@{uuid}`` from it, so the binding holds exactly the third ``@@@`` part the
reference Node gateway forwards. (The broker does not tell subscribers a publisher's client id,
so the binding is the one place the gateway can read it.) A device without a binding
(provisioned by hand) is bridged without ``Client-Id``, as the Node gateway does for a two-part
client id.

**Secrets** (``<data_dir>/secrets/chat-upstream.json``, mode 0600, like ``secrets/ota.key``)::

    {"default": {"key": "<server auth_key>"},
     "devices": {"aa_bb_cc_dd_ee_ff": {"scheme": "bearer", "token": "<that device's token>"}}}

``default`` applies to every device without an entry; ``chat.token`` is the default bearer
token when the file has none. A file the gateway cannot parse refuses the start (never
"bridge without credentials"); an entry is never logged.

Both files are re-read when their modification time changes (an approval or an operator edit
takes effect at the device's next session); reading is blocking file I/O, run off the loop.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from gateway.chat.auth import AuthScheme, AuthUnavailable, DeviceSecret, authorization
from gateway.xiaozhi.ota.trust_store import TrustFileError, bindings_path, load_bindings


class SecretsFileError(ValueError):
    """``secrets/chat-upstream.json`` cannot be used (names the file, never a value)."""


@dataclass(frozen=True, slots=True)
class UpstreamIdentity:
    """The headers a device's WebSocket carries (``authorization`` hidden from reprs)."""

    device_id: str  # the MAC, aa:bb:cc:dd:ee:ff
    client_id: str | None  # the board's UUID
    authorization: str | None

    def __repr__(self) -> str:
        auth = "set" if self.authorization else "none"
        return f"UpstreamIdentity({self.device_id}, client {self.client_id}, auth {auth})"


def secrets_path(data_dir: Path) -> Path:
    return Path(data_dir) / "secrets" / "chat-upstream.json"


def mac_of(dev: str) -> str:
    return dev.replace("_", ":")


def _secret(path: Path, where: str, entry: object) -> DeviceSecret:
    if not isinstance(entry, dict) or not set(entry) <= {"scheme", "token", "key"}:
        raise SecretsFileError(f"{path}: {where}: expected {{scheme?, token?, key?}}")
    values: dict[str, Any] = entry
    try:
        scheme = AuthScheme(values["scheme"]) if "scheme" in values else None
    except ValueError:
        raise SecretsFileError(f"{path}: {where}: unknown scheme") from None
    token, key = values.get("token"), values.get("key")
    if not all(v is None or (isinstance(v, str) and v) for v in (token, key)):
        raise SecretsFileError(f"{path}: {where}: token and key must be non-empty strings")
    return DeviceSecret(scheme=scheme, token=token, key=key)


def load_secrets(path: Path) -> tuple[DeviceSecret, dict[str, DeviceSecret]]:
    """(default, per device); a missing file is no secrets; a group/world-readable one refused."""
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return DeviceSecret(), {}
    except OSError as exc:
        raise SecretsFileError(f"{path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretsFileError(f"{path}: readable by others (chmod 600)")
    try:
        doc = json.loads(text)
    except ValueError:
        raise SecretsFileError(f"{path}: not JSON") from None
    if not isinstance(doc, dict) or not set(doc) <= {"default", "devices"}:
        raise SecretsFileError(f"{path}: expected {{default?, devices?}}")
    devices = doc.get("devices", {})
    if not isinstance(devices, dict):
        raise SecretsFileError(f"{path}: devices: expected an object")
    default = _secret(path, "default", doc.get("default", {}))
    return default, {dev: _secret(path, dev, e) for dev, e in devices.items()}


_T = TypeVar("_T")


class _Watched(Generic[_T]):
    """A file parsed again only when its mtime (or presence) changed."""

    def __init__(self, path: Path, parse: Callable[[Path], _T]) -> None:
        self._path = path
        self._parse = parse
        self._stamp: float | None = -1.0
        self._value: _T | None = None

    def get(self) -> _T:
        try:
            stamp: float | None = os.stat(self._path).st_mtime
        except FileNotFoundError:
            stamp = None
        if stamp != self._stamp or self._value is None:
            self._value = self._parse(self._path)
            self._stamp = stamp
        return self._value


class UpstreamCredentials:
    """Per device: identity + ``Authorization`` under the gateway-wide ``scheme``."""

    def __init__(
        self,
        *,
        data_dir: Path,
        scheme: AuthScheme,
        token: str | None,
        secrets_file: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._scheme = scheme
        self._token = token
        self._clock = clock
        self._bindings = _Watched(bindings_path(data_dir), load_bindings)
        self._secrets = _Watched(secrets_file or secrets_path(data_dir), load_secrets)

    def check(self) -> None:
        """Read both files now (at start-up: a broken file stops the gateway, with its name)."""
        self._secrets.get()
        try:
            self._bindings.get()
        except TrustFileError as exc:
            raise SecretsFileError(str(exc)) from None

    def identity(self, dev: str) -> UpstreamIdentity:
        """Blocking; raises :class:`AuthUnavailable` (a metric reason) when the scheme cannot
        be met for ``dev``."""
        binding = self._bindings.get().get(dev)
        client_id = binding.client_id if binding is not None else None
        default, devices = self._secrets.get()
        secret = devices.get(dev, default)
        if secret.token is None and secret.scheme in (None, AuthScheme.BEARER) and self._token:
            secret = DeviceSecret(scheme=secret.scheme, token=self._token, key=secret.key)
        header = authorization(
            self._scheme,
            secret,
            client_id=client_id,
            device_id=mac_of(dev),
            now=int(self._clock()),
        )
        return UpstreamIdentity(mac_of(dev), client_id, header)


__all__ = [
    "AuthUnavailable",
    "SecretsFileError",
    "UpstreamCredentials",
    "UpstreamIdentity",
    "load_secrets",
    "mac_of",
    "secrets_path",
]
