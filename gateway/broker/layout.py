"""Where the broker's files live under ``<data_dir>``, and what the generated config says.

Layout::

    mosquitto/mosquitto.conf   broker config (`snlpgw broker init`)
    mosquitto/users.json       registry: name → role (never passwords)
    mosquitto/passwd           Mosquitto 2.0 `$7$` hashes of every user, mode 0600
    mosquitto/passwd.gateway   the same without device users (gateway's listener), 0600
    mosquitto/passwd.devices   device users only (device listener), 0600
    mosquitto/acl              generated from the registry, mode 0600
    mosquitto/mosquitto.pid    written by the broker; SIGHUP target for reloads
    mosquitto/data/            broker persistence
    secrets/gateway.password   the gateway's own password (the only stored plaintext), 0600
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gateway.broker.rules import ConfigPaths


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


def local_listener(data_dir: Path) -> tuple[str, int] | None:
    """(host, port) of the first listener in the generated config, if there is one."""
    try:
        text = BrokerFiles.at(data_dir).config.read_text()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == "listener" and words[1].isdigit():
            return words[2], int(words[1])
    return None


def local_broker_url(data_dir: Path) -> str | None:
    """``mqtt://host:port`` of the listener in the generated config, if there is one."""
    listener = local_listener(data_dir)
    return None if listener is None else f"mqtt://{listener[0]}:{listener[1]}"


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
