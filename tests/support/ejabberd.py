"""A second, independent MQTT 5 broker for tests: ejabberd's ``mod_mqtt`` (Debian's ``ejabberd``
package, installed by ``make setup``), on a free port on 127.0.0.1, anonymous logins (any user
name and password), its Mnesia data in a temporary directory.

The Erlang VM is started directly (``erl -s ejabberd``, as ``ejabberdctl foreground`` does,
without its switch to the ``ejabberd`` user and without a node name, so no ``epmd`` is left
behind). Ready means an MQTT CONNECT got CONNACK 0 (:func:`gateway.mqtt.probe.await_login`),
never after a sleep; :meth:`Ejabberd.stop` then :meth:`Ejabberd.start` restarts it on the same
port and data. No ejabberd installed → a clear failure naming the package, never a skip.

Why ejabberd: of the brokers the project's registries offer, it is the one that speaks MQTT 5
with QoS 1 and retained messages (bench/results/second_broker.md says what else was tried).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from devstack.broker import free_port
from gateway.mqtt.probe import await_login

# The VM starts in ~1.5 s on a quiet machine and took 26 s beside `stress-ng --cpu 2` and a
# test run (30 s was missed once so): a start-up deadline, not a measure of anything.
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0

CONFIG = """\
hosts:
  - localhost
loglevel: warning
log_rotate_count: 0
auth_method: [anonymous]
anonymous_protocol: login_anon
listen:
  -
    port: {port}
    ip: "127.0.0.1"
    module: mod_mqtt
    backlog: 1000
modules:
  mod_mqtt: {{}}
"""


class EjabberdUnavailableError(RuntimeError):
    pass


def _erl_libs() -> Path:
    """The directory holding ejabberd's OTP application (``ejabberd-<version>/ebin``)."""
    found = sorted(glob.glob("/usr/lib/*/ejabberd-*/ebin"))
    if not found or shutil.which("erl") is None:
        raise EjabberdUnavailableError(
            "no ejabberd: install the Debian package `ejabberd` (`make setup` does)"
        )
    return Path(found[0]).parent.parent


class Ejabberd:
    host = "127.0.0.1"

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.port = port
        self.config = root / "ejabberd.yml"
        self.config.write_text(CONFIG.format(port=port))
        self.log_path = root / "ejabberd.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start (again, same port and data); returns once an MQTT CONNECT is accepted."""
        env = {
            **os.environ,
            "HOME": str(self.root),
            "ERL_LIBS": str(_erl_libs()),
            "EJABBERD_CONFIG_PATH": str(self.config),
            "EJABBERD_LOG_PATH": str(self.root / "ejabberd-internal.log"),
            "ERL_CRASH_DUMP_BYTES": "0",
        }
        # No scheduler busy-waiting: on a busy 2-core machine a spinning VM competes with the
        # tests for the CPU it is waiting for.
        spin = ["+sbwt", "none", "+sbwtdcpu", "none", "+sbwtdio", "none"]
        argv = [
            "erl",
            *spin,
            "-noinput",
            "-mnesia",
            "dir",
            f'"{self.root / "spool"}"',
            "-s",
            "ejabberd",
        ]
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                argv, cwd=self.root, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        try:
            self._await_ready()
        except BaseException:
            self.stop()
            raise

    def _await_ready(self) -> None:
        answer = await_login(
            self.host, self.port, "probe", "probe", within_s=READY_TIMEOUT_S,
            alive=self.check_alive, gap_s=0.05,
        )  # fmt: skip
        if answer != 0:
            raise EjabberdUnavailableError(
                f"ejabberd on port {self.port} not ready (last CONNACK {answer}):\n"
                + self.log_tail()
            )

    def check_alive(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise EjabberdUnavailableError(f"ejabberd exited:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM: the VM shuts down in order (``init:stop``); killed if it does not."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)

    def log_tail(self) -> str:
        texts = []
        for path in (self.log_path, self.root / "ejabberd-internal.log"):
            with contextlib.suppress(OSError):
                texts.append(path.read_text(errors="replace")[-1500:])
        return "\n".join(texts)


def start_ejabberd() -> Ejabberd:
    """A fresh ejabberd on a free port, ready; :func:`remove` it when done."""
    root = Path(tempfile.mkdtemp(prefix="snlp-ejabberd-"))
    broker = Ejabberd(root, free_port())
    try:
        broker.start()
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return broker


def remove(broker: Ejabberd) -> None:
    broker.stop()
    shutil.rmtree(broker.root, ignore_errors=True)
