"""How the gateway authenticates a device's WebSocket to a xiaozhi server (pure).

Followed: xinnan-tech/xiaozhi-esp32-server **v0.9.6** (2026-07-24, ``f5ed1aae``),
``core/auth.py`` ``AuthManager`` and ``core/websocket_server.py`` ``_handle_auth``; unchanged
on main ``7475ea2b`` (2026-08-06). With ``server.auth.enabled`` the server reads the headers
``device-id`` (the MAC), ``client-id`` (the device's UUID) and ``authorization: Bearer
<token>``; a device listed in ``auth.allowed_devices`` passes without a token, any other needs

    token = base64url(HMAC-SHA256(server.auth_key, f"{client_id}|{device_id}|{ts}")) + "." + ts

(no ``=`` padding, ``ts`` in Unix seconds, valid for ``auth.expire_seconds``, 30 days by
default). The xinnan-tech MQTT gateway signs the same way with its ``SERVER_SECRET`` (uuid from
the MQTT client id, MAC). A refusal is NOT an HTTP status: the server completes the WebSocket
upgrade, sends the text frame ``认证失败`` ("authentication failed") and closes (1000).

Schemes the gateway offers (``chat.auth``):

* ``none`` — no ``Authorization`` header (a server with auth disabled, or a whitelisted MAC);
* ``bearer`` — a static ``Bearer <token>``: the ``server.auth.tokens`` list of releases before
  the HMAC scheme (``AuthMiddleware``, e.g. v0.3.x) and the reference Node gateway's fixed
  ``test-token``; also a token the server's OTA issued to one device (``websocket.token``);
* ``hmac`` — the v0.9.6 token above, computed per connection.

Secrets are per device (:class:`DeviceSecret`, from ``secrets/chat-upstream.json``) with a
default for every other device; they never appear in logs or reprs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass, field
from enum import Enum

AUTH_FAILED_TEXT = "认证失败"  # v0.9.6 websocket_server._handle_connection's refusal


class AuthScheme(Enum):
    NONE = "none"
    BEARER = "bearer"
    HMAC = "hmac"


class AuthUnavailable(ValueError):
    """The scheme needs something this device lacks; ``reason`` is a metric label."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True, slots=True)
class DeviceSecret:
    """One device's upstream credentials (or the default for all). ``scheme`` None: the
    gateway-wide scheme. Secret values are hidden from ``repr`` (logs, tracebacks)."""

    scheme: AuthScheme | None = None
    token: str | None = field(default=None, repr=False)  # bearer
    key: str | None = field(default=None, repr=False)  # hmac: the server's auth_key


def hmac_token(key: str, client_id: str, device_id: str, ts: int) -> str:
    """The v0.9.6 ``AuthManager.generate_token`` for ``client_id`` / ``device_id`` at ``ts``."""
    content = f"{client_id}|{device_id}|{ts}".encode()
    digest = hmac.new(key.encode(), content, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=") + f".{ts}"


def verify_hmac_token(
    token: str, key: str, *, client_id: str | None, device_id: str | None, now: int, expire_s: int
) -> bool:
    """The server's ``verify_token`` (used by the test peer; kept here beside its twin)."""
    try:
        sig, ts_text = token.split(".")
        ts = int(ts_text)
    except ValueError:
        return False
    if now - ts > expire_s:
        return False
    expected = hmac_token(key, str(client_id), str(device_id), ts).split(".")[0]
    return hmac.compare_digest(sig, expected)


def authorization(
    scheme: AuthScheme,
    secret: DeviceSecret,
    *,
    client_id: str | None,
    device_id: str,
    now: int,
) -> str | None:
    """The ``Authorization`` header value, ``None`` for none; :class:`AuthUnavailable` when the
    scheme cannot be satisfied for this device (no secret, or no UUID for HMAC)."""
    match secret.scheme or scheme:
        case AuthScheme.NONE:
            return None
        case AuthScheme.BEARER:
            if not secret.token:
                raise AuthUnavailable("no_token")
            return f"Bearer {secret.token}"
        case _:  # AuthScheme.HMAC
            if not secret.key:
                raise AuthUnavailable("no_auth_key")
            if not client_id:
                # the server signs with its client-id header: without the UUID it checks
                # "None|mac|ts" and refuses; say so here instead of being refused there
                raise AuthUnavailable("no_client_id")
            return f"Bearer {hmac_token(secret.key, client_id, device_id, now)}"
