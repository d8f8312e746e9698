"""The dev stack's Mosquitto: the project's generated config on free loopback ports.

:func:`start_broker` writes the broker files (``gateway.broker``: password file, ACL,
limits) under a data dir and starts a broker: the local ``mosquitto`` binary
(:class:`LocalMosquitto`: the argv of ``snlpgw dev-run``'s, :func:`gateway.devrun.mosquitto_command`), or ``eclipse-mosquitto:2.0`` through testcontainers
(:mod:`devstack.broker_container`) when asked or, for ``backend="auto"``, when a Docker engine
answers. It returns once the gateway user completes an MQTT CONNECT (:func:`gateway.mqtt.probe.await_login`,
the one probe loop) — never after a sleep; :meth:`Broker.provision` likewise returns once the
new user is accepted. :func:`local_broker` is the same for async code (demo, benchmarks),
stopped when the block exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Literal, Protocol

from gateway.broker.credentials import (
    BrokerFiles,
    Credentials,
    RoleName,
    gateway_password,
    init_broker_files,
    provision,
)
from gateway.broker.rules import GATEWAY_USERNAME, GRANTS, Role, default_device_port
from gateway.devrun import StartError, mosquitto_command
from gateway.mqtt.probe import await_login

READY_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0
BackendName = Literal["local", "container", "auto"]


class StackError(RuntimeError):
    """The dev stack could not be brought up; the message says what is missing."""


_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_PICK_SPAN = 12_000  # ports picked from this far below the ephemeral range up to it
# "INDEX/COUNT": this process is one of COUNT that pick ports at once (the test suite's parallel
# workers, tests/conftest.py); each picks only from its own COUNT-th of the range, so a port one
# worker picked and released (before its broker binds it, or while a broker restarts on it) is
# never another worker's pick. Not a settings field: pydantic-settings ignores it.
PORT_SLICE_VAR = "SNLPGW_TEST_PORT_SLICE"


def _pick_range() -> tuple[int, int] | None:
    """Ports no port-0 bind and no outgoing connection is given (below the kernel's ephemeral
    range), or ``None`` where that range is unknown or leaves no room; only this process's
    slice of it when :data:`PORT_SLICE_VAR` names one."""
    try:
        low = int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if low <= 2048:
        return None
    return _slice((max(1024, low - _PICK_SPAN), low - 1), os.environ.get(PORT_SLICE_VAR, ""))


def _slice(span: tuple[int, int], spec: str) -> tuple[int, int]:
    """``span``'s part ``INDEX`` of ``COUNT`` equal parts (``spec`` = ``"INDEX/COUNT"``); the
    whole ``span`` when ``spec`` is empty or not such a pair."""
    index, _, count = spec.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        return span
    width = (span[1] - span[0] + 1) // int(count)
    if width < 1:
        return span
    start = span[0] + int(index) * width
    return start, start + width - 1


def free_ports(*kinds: int) -> list[int]:
    """Distinct free loopback ports, one per socket kind. All are held until every one is
    picked (two picks never repeat), and they come from below the ephemeral range, so no
    port-0 listener or outgoing connection takes one before its user binds it (port 0 gave the
    same port twice in a row, or a port a connection then used, on a loaded CI)."""
    held: list[socket.socket] = []
    span = _pick_range()
    try:
        for kind in kinds:
            while True:
                sock = socket.socket(socket.AF_INET, kind)
                port = 0 if span is None else secrets.choice(range(span[0], span[1] + 1))
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:  # taken (or picked twice): another
                    sock.close()
                    continue
                held.append(sock)
                break
        return [int(sock.getsockname()[1]) for sock in held]
    finally:
        for sock in held:
            sock.close()


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    return free_ports(kind)[0]


def free_broker_ports(*others: int) -> tuple[list[int], int]:
    """:func:`free_ports` for ``make run`` (``others``: socket kinds after the broker's): the
    broker's gateway port first, and the free device port that ``make run`` derives from it
    (:func:`gateway.broker.rules.default_device_port`), distinct from every pick."""
    while True:
        picked = free_ports(socket.SOCK_STREAM, *others)
        device = default_device_port(picked[0])
        if device in picked:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", device))
            except OSError:
                continue
        return picked, device


class BrokerBackend(Protocol):
    kind: Literal["local", "container"]
    host: str

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def reload(self) -> None: ...
    def pid(self) -> int | None: ...
    def check_alive(self) -> None: ...
    def reload_command(self) -> list[str] | None: ...


class LocalMosquitto:
    """``mosquitto -c CONFIG`` as a child process; its output goes to ``broker.log`` beside."""

    kind: Literal["local", "container"] = "local"
    host = "127.0.0.1"

    def __init__(self, config: Path) -> None:
        try:
            self._argv = mosquitto_command(config)
        except StartError as exc:
            raise StackError(str(exc)) from None
        self._proc: subprocess.Popen[bytes] | None = None
        self.log_path = config.with_name("broker.log")

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
                self._argv,
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
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)

    def reload(self) -> None:
        if self._proc is None:
            raise StackError("broker is stopped")
        os.kill(self._proc.pid, signal.SIGHUP)

    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def check_alive(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise StackError(f"mosquitto exited; log tail:\n{self.log_tail()}")

    def reload_command(self) -> list[str] | None:
        return None  # the CLI finds the local broker through its pid file

    def log_tail(self) -> str:
        path = self.log_path
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""


class Broker:
    """A running broker with the project's config; ``provision`` reloads it."""

    def __init__(
        self,
        data_dir: Path,
        port: int,
        backend: BrokerBackend,
        files: BrokerFiles,
        device_port: int | None = None,
        *,
        devices_on_main: bool = True,
    ) -> None:
        self.data_dir = data_dir
        self.port = port
        # The listener boards are sent to in production: client id forced to the user name.
        self.device_port = device_port
        # Whether device users may also log in on the first listener (not on a split broker).
        self.devices_on_main = devices_on_main
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
            raise StackError("this broker has no device listener")
        return f"mqtt://{self.host}:{self.device_port}"

    @property
    def pid(self) -> int | None:
        return self._backend.pid()

    @property
    def local_pid(self) -> int:
        """The pid of a local broker (benchmarks meter its CPU); a container's is not ours."""
        pid = self._backend.pid()
        if pid is None:
            raise StackError(f"a {self.kind} broker has no local process")
        return pid

    @property
    def reload_command(self) -> list[str] | None:
        """For `snlpgw provision --reload-command` when the pid file cannot reach the broker."""
        return self._backend.reload_command()

    def provision(self, name: str, role: Role | RoleName = "device") -> Credentials:
        """Create ``name`` (or rotate its password) and return once the broker accepts it (a
        connect as the user where it logs in, signalling again if the reload was lost:
        Mosquitto drops a SIGHUP that arrives during another reload). The ACL is written before
        the password files, so accepted means its ACL lines are loaded too. Devices of a split
        broker are probed on the device listener (which names the probe after the user: a
        rotated device's session ends on the reload anyway)."""
        creds = provision(self.data_dir, name, role=role, reload=self.reload)
        if creds.password is not None:
            port = self.login_port(creds.role)
            wait_ready(
                self.host, port, creds.username, creds.password, alive=self.check_alive,
                reload=self.reload, gap_s=0.01,
            )  # fmt: skip
        return creds

    def login_port(self, role: Role) -> int:
        """The listener a user of ``role`` logs in on: the device listener for devices of a
        split broker, else the first one."""
        if role is Role.DEVICE and not self.devices_on_main and self.device_port is not None:
            return self.device_port
        return self.port

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

    def check_alive(self) -> None:
        """Raises :class:`StackError` (with the broker's log tail) if the broker has exited."""
        self._backend.check_alive()

    def start(self) -> None:
        """Start (again) on the same port with the same data dir; returns once CONNECT works."""
        self._backend.start()
        try:
            creds = self.gateway_credentials()
            wait_ready(
                self.host,
                self.port,
                creds.username,
                creds.password,
                alive=self.check_alive,
            )
        except BaseException:
            self._backend.stop()
            raise

    def stop(self) -> None:
        self._backend.stop()


def wait_ready(
    host: str,
    port: int,
    username: str | None,
    password: str | None,
    *,
    alive: Callable[[], None] = lambda: None,
    ca_file: Path | None = None,
    timeout_s: float = READY_TIMEOUT_S,
    reload: Callable[[], None] | None = None,
    gap_s: float = 0.05,
) -> None:
    """Return once ``username`` completes an MQTT CONNECT (after a start or a credentials
    reload); ``alive`` raises if the broker died meanwhile; ``reload`` is signalled again
    while refused (:func:`gateway.mqtt.probe.await_login`)."""
    last = await_login(
        host, port, username, password, within_s=timeout_s, ca_file=ca_file, reload=reload,
        alive=alive, gap_s=gap_s,
    )  # fmt: skip
    if last != 0:
        raise StackError(f"broker on port {port} not ready: last CONNACK {last}")


async def wait_connectable(broker: Broker, username: str, password: str | None) -> None:
    """:func:`wait_ready` for async code (a user just provisioned, before it connects),
    signalling the broker's reload again while the user is refused (a lost SIGHUP)."""
    await asyncio.to_thread(
        wait_ready, broker.host, broker.port, username, password, alive=broker.check_alive,
        reload=broker.reload,
    )  # fmt: skip


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


def start_broker(
    data_dir: Path,
    *,
    split: bool = False,
    device_listener: bool = True,
    extra_config: str = "",
    backend: BackendName = "local",
) -> Broker:
    """Write the broker files under ``data_dir`` and start a broker on a free port.

    ``device_listener``: a second listener, the one boards are sent to; ``split``: that config
    as `snlpgw broker init` and `make run` write it, where the first listener admits no device
    user (by default device users may also log in there, as most simulated boards in the tests
    connect there: a test harness shape, never a broker that faces boards). ``extra_config``: lines appended to the generated configuration
    (benchmarks' variants; local broker only)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port, second = free_ports(socket.SOCK_STREAM, socket.SOCK_STREAM)
    device_port = second if device_listener else None
    files = init_broker_files(
        data_dir,
        listener_host="127.0.0.1",
        listener_port=port,
        device_port=device_port,
        devices_on_gateway_listener=device_listener and not split,
    )
    if extra_config:
        with files.config.open("a") as config:
            config.write(extra_config)
    chosen: BrokerBackend
    if backend == "container" or (backend == "auto" and docker_answers()):
        from devstack.broker_container import ContainerMosquitto  # noqa: PLC0415

        if device_port is None:
            raise StackError("the container broker always has a device listener")
        chosen = ContainerMosquitto(files, port, device_port, split=split)
    else:
        chosen = LocalMosquitto(files.config)
    broker = Broker(data_dir, port, chosen, files, device_port, devices_on_main=not split)
    broker.start()
    return broker


@contextlib.asynccontextmanager
async def local_broker(data_dir: Path, *, extra_config: str = "") -> AsyncIterator[Broker]:
    """A local Mosquitto with the project's config on a free port (one listener), ready when
    the gateway user connects; stopped when the block exits."""
    broker = await asyncio.to_thread(
        start_broker, data_dir, device_listener=False, extra_config=extra_config
    )
    try:
        yield broker
    finally:
        await asyncio.to_thread(broker.stop)
