"""``snlpgw dev-run`` — what ``make run`` runs: a local Mosquitto and the gateway, supervised.

Both children run in sessions of their own, so a signal sent to make's process group (Ctrl-C,
``timeout``, CI runners, a closing terminal) reaches this supervisor only, which stops them in
order: the gateway first (it publishes its retained ``online: false`` while the broker is still
up), then the broker. Every exit path reaps both; should the supervisor itself be killed, the
kernel sends both children SIGTERM (``PR_SET_PDEATHSIG``).

Stop signals: SIGINT, SIGTERM, SIGHUP, each unless inherited as ignored (``nohup make run``).
GNU make passes SIGTERM on to its recipe but, sent SIGINT or SIGHUP on its own, only waits for
the recipe; so the supervisor also watches the make that started it: make sitting in its
fatal-signal handler (the signal shows in make's blocked mask in ``/proc/PID/status``) or gone
counts as a stop signal.

The broker has the production shape (:func:`broker_files`): the gateway's listener on
``mqtt.url`` and the devices' ten ports above it (1883 and 1893 by default), each with its own
password file, client ids forced to user names on the devices' one.

A second instance on the same data dir is told the running one's pid and ports; a port held by
anything else is named with its owner. Ports come from the settings (``SNLPGW_MQTT__URL`` — the
device listener follows it —, ``SNLPGW_HTTP__PORT``, ``SNLPGW_HTTP__ADMIN_PORT``,
``SNLPGW_UDP__PORT``), so several stacks can run side by side.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from gateway.broker.credentials import (
    BrokerFiles,
    CredentialsError,
    gateway_password,
    init_broker_files,
)
from gateway.broker.rules import DEVICE_PORT_OFFSET, default_device_port
from gateway.mqtt.probe import connack
from gateway.ports import Proto, describe_holder, port_free
from gateway.procwatch import fatal_signal_in_handler, make_ancestor
from gateway.settings import Settings

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
BROKER_READY_S = 15.0
BROKER_STOP_S = 10.0
TICK_S = 0.2
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


class StartError(Exception):
    """Nothing was started; the message says why (printed without a traceback)."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    what: str
    host: str
    port: int
    proto: Proto

    def __str__(self) -> str:
        return f"{self.what} {self.host}:{self.port}/{self.proto}"


def say(message: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # the terminal may be gone (hang-up)
        print(f"dev-run: {message}", file=sys.stderr, flush=True)  # noqa: T201 - CLI output


def endpoints(settings: Settings) -> list[Endpoint]:
    mqtt = settings.mqtt
    if mqtt.tls or mqtt.host not in _LOOPBACK:
        raise StartError(
            f"dev-run starts its own broker on loopback, but mqtt.url is {mqtt.url}; "
            "run `snlpgw run` to use another broker"
        )
    out = [
        Endpoint("broker", mqtt.host, mqtt.port, "tcp"),
        Endpoint("broker (devices)", mqtt.host, default_device_port(mqtt.port), "tcp"),
    ]
    if settings.http.port:
        out.append(Endpoint("HTTP", settings.http.host, settings.http.port, "tcp"))
    if settings.http.admin_port:
        out.append(
            Endpoint("admin HTTP", settings.http.admin_host, settings.http.admin_port, "tcp")
        )
    if settings.console.enabled and settings.http.console_port:
        out.append(
            Endpoint("console HTTP", settings.http.console_host, settings.http.console_port, "tcp")
        )
    if settings.udp.port:
        out.append(Endpoint("UDP audio", settings.udp.host, settings.udp.port, "udp"))
    return out


@contextlib.contextmanager
def instance_lock(data_dir: Path, ends: list[Endpoint]) -> Iterator[None]:
    """Hold ``<data_dir>/dev-run.lock`` (it names our pid and ports) for the whole run."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "dev-run.lock"
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StartError(_already_running(handle, data_dir)) from None
        handle.truncate(0)
        handle.write(json.dumps({"pid": os.getpid(), "ports": [str(e) for e in ends]}))
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)


def _already_running(handle: IO[str], data_dir: Path) -> str:
    handle.seek(0)
    try:
        info = json.loads(handle.read())
        pid, ports = int(info["pid"]), ", ".join(info["ports"])
    except (ValueError, KeyError, TypeError):
        return f"another dev-run holds {data_dir}/dev-run.lock; stop it first"
    return (
        f"already running as pid {pid} (data dir {data_dir}): {ports}. "
        f"Stop it with Ctrl-C in its terminal or `kill {pid}`"
    )


def check_ports(ends: list[Endpoint]) -> None:
    for end in ends:
        if not port_free(end.host, end.port, end.proto):
            holder = describe_holder(end.port, end.proto)
            raise StartError(
                f"{end} is in use by {holder}; stop it, or pick other ports "
                f"(SNLPGW_MQTT__URL, the devices' listener {DEVICE_PORT_OFFSET} above it; "
                "SNLPGW_HTTP__PORT, SNLPGW_HTTP__ADMIN_PORT, SNLPGW_UDP__PORT)"
            )


def broker_files(settings: Settings) -> BrokerFiles:
    """Write the broker files as ``make run`` starts Mosquitto: the production shape. The
    gateway's listener is ``mqtt.url`` (loopback) with gateway, ops and backend users only; the
    devices' listener, :func:`gateway.broker.rules.default_device_port` beside it, has device
    users only and forces each client id to the user name, so no device can disconnect another
    (or the gateway) by reusing its client id. OTA hands boards the device listener."""
    mqtt = settings.mqtt
    return init_broker_files(
        settings.data_dir,
        listener_host=mqtt.host,
        listener_port=mqtt.port,
        device_port=default_device_port(mqtt.port),
    )


def mosquitto_command(config: Path) -> list[str]:
    """The broker's argv with a generated configuration: how the repository starts Mosquitto
    (here, and in the dev stack the demo, tests and benchmarks use)."""
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(binary).exists():
        raise StartError("no `mosquitto` binary found (install it: `make setup`)")
    return [binary, "-c", str(config)]


def _child_setup() -> None:
    """Runs in each child between fork and exec: die with the supervisor, default signals."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def spawn(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(  # noqa: S603 - fixed argv, no shell
        argv,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # group signals are ours to forward, in order
        preexec_fn=_child_setup,  # noqa: PLW1509 - no threads run in the supervisor
    )


class Supervisor:
    def __init__(self, settings: Settings, config: Path | None) -> None:
        self.settings = settings
        self.config = config
        self.broker: subprocess.Popen[bytes] | None = None
        self.gateway: subprocess.Popen[bytes] | None = None
        self.waited = [s for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
        self._make = make_ancestor()
        self._parent = os.getppid()
        self._make_seen: signal.Signals | None = None

    def run(self) -> int:
        data_dir = self.settings.data_dir
        ends = endpoints(self.settings)
        with instance_lock(data_dir, ends):
            check_ports(ends)
            signal.pthread_sigmask(signal.SIG_BLOCK, self.waited)
            try:
                return self._supervise(ends[0], ends[1])
            finally:
                self._stop_all()

    def _supervise(self, broker_end: Endpoint, device_end: Endpoint) -> int:
        try:
            files = broker_files(self.settings)
        except (CredentialsError, OSError) as exc:
            raise StartError(f"broker files: {exc}") from None
        self.broker = spawn(mosquitto_command(files.config))
        say(
            f"broker pid {self.broker.pid} on {broker_end.host}:{broker_end.port} (gateway), "
            f"{device_end.host}:{device_end.port} (devices)"
        )
        password = self.settings.mqtt.password or gateway_password(self.settings.data_dir)
        username = self.settings.mqtt.username
        deadline = time.monotonic() + BROKER_READY_S
        while connack(broker_end.host, broker_end.port, username, password, timeout_s=2) != 0:
            if (reason := self._stop_reason()) is not None:
                if self.broker.poll() is not None:
                    raise StartError(f"{reason} before accepting connections (its log is above)")
                say(f"{reason}; stopping")
                return 0
            if time.monotonic() > deadline:
                raise StartError(f"broker not accepting the gateway user after {BROKER_READY_S}s")
        args = ["--config", str(self.config)] if self.config else []
        self.gateway = spawn([sys.executable, "-m", "gateway", *args, "run"])
        say(f"gateway pid {self.gateway.pid}; stop both with Ctrl-C or `kill {os.getpid()}`")
        while (reason := self._stop_reason()) is None:
            pass
        say(f"{reason}; stopping the gateway, then the broker")
        crashed = _exited(self.gateway) or self.broker.poll() is not None
        self._stop_all()
        return (self.gateway.returncode or 1) if crashed else 0

    def _stop_reason(self) -> str | None:
        """Wait one tick for a stop signal; the reason to stop, or None to keep running."""
        if not self.waited:
            time.sleep(TICK_S)  # every stop signal ignored (nohup + background): poll only
        elif (got := signal.sigtimedwait(self.waited, TICK_S)) is not None:
            return f"got {signal.Signals(got.si_signo).name}"
        if self.broker is not None and self.broker.poll() is not None:
            return f"broker exited ({self.broker.returncode})"
        if self.gateway is not None and _exited(self.gateway):
            return "gateway exited"
        if os.getppid() != self._parent:
            return "parent process gone"
        if self._make is not None:
            sig = fatal_signal_in_handler(self._make)
            if sig is not None and sig == self._make_seen and sig in self.waited:
                return f"make got {sig.name}"
            self._make_seen = sig  # seen on two ticks in a row: make is stuck in its handler
        return None

    def _stop_all(self) -> None:
        if self.gateway is not None and self.gateway.returncode is None:
            _stop_group(self.gateway, self.settings.ops.shutdown_timeout_s + 5.0)
        if self.broker is not None:
            _stop(self.broker, BROKER_STOP_S)
        # Stop signals stay blocked: one arriving now (make forwarding the group's SIGTERM)
        # must not kill us before our caller returns the exit code.


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """Has ``proc`` exited? It is not reaped: its pid (and process group) stay ours."""
    if proc.returncode is not None:
        return True
    return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _stop_group(proc: subprocess.Popen[bytes], budget_s: float) -> None:
    """SIGTERM the gateway, wait for it, then SIGKILL whatever is left of its process group
    (ASR workers) while its unreaped pid still holds the group id, and reap it."""
    if not _exited(proc):
        proc.terminate()
    deadline = time.monotonic() + budget_s
    while not _exited(proc) and time.monotonic() < deadline:
        time.sleep(0.05)  # no timed wait that leaves the child unreaped exists; poll briefly
    if not _exited(proc):
        say(f"pid {proc.pid} did not stop within {budget_s:.0f}s; killing it")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _stop(proc: subprocess.Popen[bytes], budget_s: float) -> None:
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=budget_s)
    except subprocess.TimeoutExpired:
        say(f"pid {proc.pid} did not stop within {budget_s:.0f}s; killing it")
        proc.kill()
        proc.wait()


def dev_run(settings: Settings, config: Path | None) -> int:
    try:
        return Supervisor(settings, config).run()
    except StartError as exc:
        say(f"cannot start: {exc}")
        return 2
