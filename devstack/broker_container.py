"""The container backend of the test broker: ``eclipse-mosquitto:2.0`` via testcontainers.

The data dir's ``mosquitto/`` is mounted read-write at ``/snlp/mosquitto`` (outside the image's
``/mosquitto``, which its entrypoint chowns), the config is rendered with in-container paths,
and the broker listens on a fixed host port so ``start()`` after ``stop()`` keeps the URL.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Literal

from devstack.broker import StackError
from gateway.broker.credentials import BrokerFiles
from gateway.broker.rules import ConfigPaths, render_config

IMAGE = "eclipse-mosquitto:2.0"
_IN_CONTAINER = Path("/snlp/mosquitto")


class ContainerMosquitto:
    kind: Literal["local", "container"] = "container"

    def __init__(
        self, files: BrokerFiles, port: int, device_port: int, *, split: bool = False
    ) -> None:
        from testcontainers.core.container import DockerContainer  # noqa: PLC0415

        config = files.directory / "mosquitto.container.conf"
        inside = ConfigPaths(
            password_file=_IN_CONTAINER / "passwd",
            acl_file=_IN_CONTAINER / "acl",
            pid_file=Path("/tmp/mosquitto.pid"),  # noqa: S108 - container-private, never the host's
            persistence_dir=_IN_CONTAINER / "data",
            gateway_password_file=_IN_CONTAINER / "passwd.gateway",
            device_password_file=_IN_CONTAINER / "passwd.devices",
        )
        # `user root`: read the host-owned 0600 files without the image's chown dance.
        text = render_config(
            inside,
            listener_host="0.0.0.0",  # noqa: S104 - inside the container
            listener_port=1883,
            run_as="root",
            flavour="test",
            device_listener=("0.0.0.0", 1884),  # noqa: S104 - inside the container
            devices_on_gateway_listener=not split,
        )
        config.write_text(text)
        self._container: Any = (
            DockerContainer(IMAGE)
            .with_volume_mapping(str(files.directory), str(_IN_CONTAINER), "rw")
            .with_bind_ports(1883, port)
            .with_bind_ports(1884, device_port)
            .with_command(f"mosquitto -c {_IN_CONTAINER / config.name}")
        )
        self.host = "127.0.0.1"

    def start(self) -> None:
        self._container.start()
        self.host = self._container.get_container_host_ip()

    def stop(self) -> None:
        # SIGTERM first so mosquitto saves its persistence db (testcontainers' stop kills).
        with contextlib.suppress(Exception):
            self._container.get_wrapped_container().stop(timeout=10)
        self._container.stop()

    def reload(self) -> None:
        result = self._container.exec(["kill", "-HUP", "1"])
        if result.exit_code != 0:
            raise StackError(f"reload failed: {result.output!r}")

    def pid(self) -> int | None:
        return None

    def check_alive(self) -> None:
        wrapped = self._container.get_wrapped_container()
        wrapped.reload()
        status = wrapped.status
        if status in ("exited", "dead"):
            raise StackError(f"container {status}: {self._container.get_logs()!r}")

    def reload_command(self) -> list[str] | None:
        container_id = self._container.get_wrapped_container().id
        return ["docker", "exec", container_id, "kill", "-HUP", "1"]
