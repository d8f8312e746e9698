"""Where the OTA provisioner confirms a new password: the endpoint boards are sent to."""

from __future__ import annotations

import pytest

from gateway.xiaozhi.ota.provisioning import split_endpoint


@pytest.mark.parametrize(
    ("endpoint", "want"),
    [
        ("mqtt.example.com:8883", ("mqtt.example.com", 8883)),
        ("10.0.0.5:1883", ("10.0.0.5", 1883)),
        ("mqtt.example.com", ("mqtt.example.com", 8883)),  # the firmware's default port
        ("[2001:db8::1]:8883", ("2001:db8::1", 8883)),
        ("[2001:db8::1]", ("2001:db8::1", 8883)),
        ("mqtt.example.com:tls", ("mqtt.example.com:tls", 8883)),
    ],
)
def test_split_endpoint(endpoint: str, want: tuple[str, int]) -> None:
    assert split_endpoint(endpoint) == want
