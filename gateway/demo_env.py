"""A self-contained local stack for the demo and the benchmarks: Mosquitto + an in-process gateway.

:func:`local_broker` writes the project's broker files into a data directory, starts the
``mosquitto`` binary on a free loopback port and returns once the gateway user completes an MQTT
CONNECT (connecting is the readiness check). :func:`running_gateway` builds the real gateway
(:func:`gateway.app.build_gateway`) against it on ephemeral HTTP/UDP ports and stops it cleanly.
Nothing here touches the user's ``.data`` or the default ports 1883/8003/8884.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiomqtt

from gateway.app import Gateway, build_gateway
from gateway.broker.credentials import BrokerFiles, Credentials, gateway_password, init_broker_files
from gateway.broker.credentials import provision as provision_user
from gateway.broker.io import pid_file_reloader
from gateway.broker.rules import GATEWAY_USERNAME
from gateway.settings import Settings, load_settings, merge_sections

REPO_ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 15.0


class StackError(RuntimeError):
    """The local stack could not be brought up (message says what is missing)."""


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def mosquitto_binary() -> str:
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(binary).exists():
        raise StackError("no `mosquitto` binary found (install it: `make setup`)")
    return binary


@dataclass
class LocalBroker:
    data_dir: Path
    port: int
    files: BrokerFiles
    proc: subprocess.Popen[bytes]

    host = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def reload(self) -> None:
        pid_file_reloader(self.files.pid_file)()

    def provision(self, name: str, role: str = "device") -> Credentials:
        return provision_user(self.data_dir, name, role=role, reload=self.reload)  # type: ignore[arg-type]

    def log_tail(self) -> str:
        path = self.data_dir / "broker.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""


async def wait_connectable(
    broker: LocalBroker, username: str, password: str | None, *, timeout_s: float = READY_TIMEOUT_S
) -> None:
    """Return once ``username`` can CONNECT (after a start or a credentials reload)."""
    last: Exception | None = None
    async with asyncio.timeout(timeout_s):
        while True:
            if broker.proc.poll() is not None:
                raise StackError(f"mosquitto exited; log tail:\n{broker.log_tail()}")
            try:
                async with aiomqtt.Client(
                    broker.host,
                    broker.port,
                    username=username,
                    password=password,
                    identifier=f"probe-{secrets.token_hex(6)}",  # the broker refuses empty ids
                    timeout=2,
                ):
                    return
            except aiomqtt.MqttError as exc:
                last = exc
            # Spaces refused attempts while the broker starts or reloads its password file.
            await asyncio.sleep(0.05)
    raise StackError(f"broker not ready: {last}")  # pragma: no cover - timeout raises first


@contextlib.contextmanager
def _mosquitto(data_dir: Path, extra_config: str) -> Iterator[LocalBroker]:
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    files = init_broker_files(data_dir, listener_host="127.0.0.1", listener_port=port)
    if extra_config:
        with files.config.open("a") as config:
            config.write(extra_config)
    with (data_dir / "broker.log").open("ab") as log:
        proc = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
            [mosquitto_binary(), "-c", str(files.config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    try:
        yield LocalBroker(data_dir, port, files, proc)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@contextlib.asynccontextmanager
async def local_broker(data_dir: Path, *, extra_config: str = "") -> AsyncIterator[LocalBroker]:
    """A project-configured Mosquitto on a free port, ready when the gateway user connects.

    ``extra_config``: lines appended to the generated configuration (benchmarks' variants)."""
    with _mosquitto(data_dir, extra_config) as broker:
        await wait_connectable(broker, GATEWAY_USERNAME, gateway_password(data_dir))
        yield broker


def gateway_settings(broker: LocalBroker, **overrides: Any) -> Settings:
    """Settings for an in-process gateway on ``broker``: ephemeral ports, repo catalog."""
    base: dict[str, Any] = {
        "gateway_id": "demo-gw",
        "data_dir": broker.data_dir,
        "mqtt": {"url": broker.url, "password": gateway_password(broker.data_dir)},
        "http": {"host": "127.0.0.1", "port": 0, "admin_port": 0},
        "udp": {"host": "127.0.0.1", "port": 0},
        "runtime": {
            "catalog_path": REPO_ROOT / "catalog",
            "resource_dir": REPO_ROOT / "catalog" / "resources",
        },
        "ops": {"shutdown_timeout_s": 3.0},
    }
    return load_settings(**merge_sections(base, overrides))


@contextlib.asynccontextmanager
async def running_gateway(settings: Settings) -> AsyncIterator[Gateway]:
    """The composed gateway, serving until the block exits (then a bounded clean shutdown)."""
    gw = build_gateway(settings)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(gw.service.serve(until=stop), name="demo.gateway")
        try:
            async with asyncio.timeout(20):
                await gw.service.mqtt.wait_connected()
                await gw.service.http.wait_started()
                await gw.service.admin.wait_started()
                await gw.xiaozhi.wait_ready()
                await gw.tasks.wait_ready()
            yield gw
        finally:
            stop.set()
            async with asyncio.timeout(settings.ops.shutdown_timeout_s + 5):
                await task
