"""A real Mosquitto with the project's generated config, for integration tests.

:func:`start_broker` runs ``eclipse-mosquitto:2.0`` through testcontainers when a Docker engine
answers a ping, otherwise the local ``mosquitto`` binary on a free port. Either way the broker
reads the files ``gateway.broker.credentials`` writes (password file, ACL, limits), and is ready when
the gateway user completes an MQTT CONNECT — never after a sleep. Neither available → a clear
failure, never a skip. ``SNLPGW_TEST_BROKER=local|container`` forces one.

Used through the fixtures in ``tests/integration/conftest.py``: ``broker`` (session),
``fresh_broker`` (per test, may be stopped/started), ``device_id``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol

from paho.mqtt.client import Client
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from gateway import demo_env
from gateway.broker.credentials import (
    BrokerFiles,
    Credentials,
    RoleName,
    gateway_password,
    init_broker_files,
    provision,
)
from gateway.broker.rules import GATEWAY_USERNAME, GRANTS, Role
from gateway.demo_env import free_port

READY_TIMEOUT_S = 15.0


class BrokerUnavailableError(RuntimeError):
    pass


class Backend(Protocol):
    kind: Literal["local", "container"]
    host: str

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def reload(self) -> None: ...
    def pid(self) -> int | None: ...
    def check_alive(self) -> None: ...
    def reload_command(self) -> list[str] | None: ...


class LocalMosquitto:
    kind: Literal["local", "container"] = "local"
    host = "127.0.0.1"

    def __init__(self, config: Path, binary: str) -> None:
        self._config = config
        self._binary = binary
        self._proc: subprocess.Popen[bytes] | None = None
        self.log_path = config.with_name("broker.log")

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [self._binary, "-c", str(self._config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def reload(self) -> None:
        if self._proc is None:
            raise BrokerUnavailableError("broker is stopped")
        os.kill(self._proc.pid, signal.SIGHUP)

    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def check_alive(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise BrokerUnavailableError(f"mosquitto exited; log tail:\n{tail}")

    def reload_command(self) -> list[str] | None:
        return None  # the CLI finds the local broker through its pid file


class Broker:
    """A running broker with the project's config; ``provision`` reloads it."""

    def __init__(
        self,
        data_dir: Path,
        port: int,
        backend: Backend,
        files: BrokerFiles,
        device_port: int | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.port = port
        # The listener boards are sent to in production: client id forced to the user name.
        self.device_port = device_port
        self.files = files
        self._backend = backend

    @property
    def kind(self) -> str:
        return self._backend.kind

    @property
    def host(self) -> str:
        return self._backend.host

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    @property
    def device_url(self) -> str:
        if self.device_port is None:
            raise BrokerUnavailableError("this broker has no device listener")
        return f"mqtt://{self.host}:{self.device_port}"

    @property
    def pid(self) -> int | None:
        return self._backend.pid()

    @property
    def reload_command(self) -> list[str] | None:
        """For `snlpgw provision --reload-command` when the pid file cannot reach the broker."""
        return self._backend.reload_command()

    def provision(self, name: str, role: Role | RoleName = "device") -> Credentials:
        return provision(self.data_dir, name, role=role, reload=self.reload)

    def gateway_credentials(self) -> Credentials:
        grants = GRANTS[Role.GATEWAY]
        return Credentials(
            username=GATEWAY_USERNAME,
            password=gateway_password(self.data_dir),
            role=Role.GATEWAY,
            client_id=None,
            publish=grants.readwrite,
            subscribe=grants.readwrite + grants.subscribe,
        )

    def reload(self) -> None:
        self._backend.reload()

    def start(self) -> None:
        """Start (again) on the same port with the same data dir; returns once CONNECT works."""
        self._backend.start()
        try:
            self._wait_ready()
        except BaseException:
            self._backend.stop()
            raise

    def stop(self) -> None:
        self._backend.stop()

    def _wait_ready(self) -> None:
        creds = self.gateway_credentials()
        wait_ready(
            self.host, self.port, creds.username, creds.password, alive=self._backend.check_alive
        )


def wait_ready(
    host: str,
    port: int,
    username: str,
    password: str | None,
    *,
    alive: Callable[[], None],
    ca_file: Path | None = None,
) -> None:
    """Return once ``username`` completes an MQTT CONNECT; ``alive`` raises if the broker died."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    last: object = None
    while time.monotonic() < deadline:
        alive()
        code = connect_reason_code(host, port, username, password, ca_file=ca_file)
        if code == 0:
            return
        last = code
        # A connect attempt is the wait; this short pause only spaces refused attempts.
        threading.Event().wait(0.05)
    raise BrokerUnavailableError(f"broker on port {port} not ready: last result {last}")


def connect_reason_code(
    host: str,
    port: int,
    username: str | None,
    password: str | None,
    *,
    timeout: float = 5.0,
    ca_file: Path | None = None,
) -> int | None:
    """MQTT 5 CONNACK reason code (0 = accepted); None when no CONNACK (e.g. refused socket)."""
    done = threading.Event()
    result: list[int] = []

    def on_connect(client: Client, userdata: object, flags: object, rc: Any, props: object) -> None:
        result.append(int(rc.value))
        done.set()

    client = Client(
        CallbackAPIVersion.VERSION2,
        client_id=f"probe-{uuid.uuid4().hex[:12]}",
        protocol=MQTTProtocolVersion.MQTTv5,
    )
    if username is not None:
        client.username_pw_set(username, password)
    if ca_file is not None:
        client.tls_set(ca_certs=str(ca_file))
    client.on_connect = on_connect
    client.on_disconnect = lambda *_: done.set()  # closed without CONNACK: no answer
    try:
        client.connect(host, port, keepalive=10)
    except OSError:
        return None
    client.loop_start()
    try:
        done.wait(timeout)
    finally:
        with contextlib.suppress(Exception):
            client.disconnect()
        client.loop_stop()
    return result[0] if result else None


def docker_answers() -> bool:
    """True when a Docker engine answers a ping; fast (no engine → no client is built)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://"):
        # Connect ourselves first: docker-py leaks its socket when the engine is absent.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            try:
                sock.connect(host.removeprefix("unix://"))
            except OSError:
                return False
    try:
        import docker  # type: ignore[import-untyped]  # noqa: PLC0415

        client = docker.from_env(timeout=2)
    except Exception:
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


def new_device_id() -> str:
    """A random board id in the device form (``aa_bb_cc_dd_ee_ff``): a unicast, locally
    administered MAC, as the OTA endpoint accepts only unicast device MACs."""
    raw = bytearray(secrets.token_bytes(6))
    raw[0] = (raw[0] & 0xFC) | 0x02
    return "_".join(f"{b:02x}" for b in raw)


def mosquitto_binary() -> str:
    try:
        return demo_env.mosquitto_binary()
    except demo_env.StackError as exc:
        raise BrokerUnavailableError(
            "integration tests need a broker: no Docker engine answered and no `mosquitto` "
            "binary was found (install it: apt-get install mosquitto, or `make setup`)"
        ) from exc


def start_broker(data_dir: Path, *, split: bool = False) -> Broker:
    """Write the broker files under ``data_dir`` and start a broker on a free port.

    ``split``: the config `snlpgw broker init --device-port` writes, where the first listener
    admits no device user. By default device users may also log in on the first listener,
    because most tests' simulated boards still connect there."""
    port = free_port()
    device_port = free_port()
    files = init_broker_files(
        data_dir,
        listener_host="127.0.0.1",
        listener_port=port,
        device_port=device_port,
        devices_on_gateway_listener=not split,
    )
    forced = os.environ.get("SNLPGW_TEST_BROKER", "")
    backend: Backend
    if forced == "container" or (forced != "local" and docker_answers()):
        from tests.support.broker_container import ContainerMosquitto  # noqa: PLC0415

        backend = ContainerMosquitto(files, port, device_port, split=split)
    else:
        backend = LocalMosquitto(files.config, mosquitto_binary())
    broker = Broker(data_dir, port, backend, files, device_port)
    broker.start()
    return broker
