"""Admin surface attacks found in review: the approval API exposed beyond loopback without a
token."""

from __future__ import annotations

import pytest
from pydantic import SecretStr, ValidationError

from gateway.settings import Settings


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "gw.example.org"])
def test_admin_listener_beyond_loopback_needs_a_token(host: str) -> None:
    """Attack: an operator binds the admin listener beyond loopback (say, for a remote Prometheus) without a token, so anyone on the network approves the activation code OTA gave them for a spoofed MAC and takes that board's identity.
    Defence: the settings refuse a non-loopback `http.admin_host` without a non-empty `http.admin_token` (the gateway does not start), and an empty token is refused everywhere."""
    with pytest.raises(ValidationError, match="admin_token"):
        Settings(http={"admin_host": host})
    with pytest.raises(ValidationError, match="admin_token"):
        Settings(http={"admin_host": host, "admin_token": ""})
    with pytest.raises(ValidationError, match="admin_token"):
        Settings(http={"admin_token": ""})
    guarded = Settings(http={"admin_host": host, "admin_token": "s3cret-admin-token"})
    assert guarded.http.admin_token == SecretStr("s3cret-admin-token")
    for loopback in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert Settings(http={"admin_host": loopback}).http.admin_token is None
