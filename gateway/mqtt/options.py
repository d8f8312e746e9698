"""What a client connection to the broker is opened with (:class:`ClientOptions`, and the
CONNECT they make) and how it fails (:class:`MqttError`, :class:`ConnectRefused`). The
connection itself is :mod:`gateway.mqtt.client`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.mqtt import codec


class MqttError(Exception):
    """The connection failed, was refused or was lost."""


class ConnectRefused(MqttError):
    def __init__(self, reason: int) -> None:
        super().__init__(f"broker refused the connection (reason code {reason})")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ClientOptions:
    client_id: str
    keepalive_s: int = 60
    username: str | None = None
    password: str | None = None
    will: codec.Will | None = None
    version: int = codec.V5
    receive_maximum: int | None = None

    def connect_packet(self) -> bytes:
        """CONNECT with these options and a clean start."""
        return codec.connect(
            client_id=self.client_id,
            keepalive_s=self.keepalive_s,
            username=self.username,
            password=self.password,
            will=self.will,
            version=self.version,
            receive_maximum=self.receive_maximum,
        )
