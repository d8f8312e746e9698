"""`make run` as a process, on its own ports and data dir (tests/integration/test_make_run.py).

Every process the session starts inherits a marker variable; :func:`session_pids` finds them
in ``/proc/*/environ`` (re-parented or in other sessions alike), so a test can assert that none
survive. Output (a pipe, or a pseudo-terminal that can be "closed") is drained by a thread so
the children never block on a full pipe.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import termios
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from paho.mqtt.client import Client, MQTTMessage
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from devstack.broker import free_broker_ports
from gateway.ports import port_free

ROOT = Path(__file__).parents[2]
MARK_VAR = "SNLPGW_TEST_SESSION_MARK"  # not a settings field: pydantic-settings ignores it
READY_S = 60.0
STOP_S = 30.0


def session_pids(mark: str) -> set[int]:
    needle = f"{MARK_VAR}={mark}".encode()
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.add(int(entry.name))
    return found


def _default_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)  # as in an interactive terminal
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


class MakeRun:
    """One ``make run`` on free ports; ``start()`` returns once the gateway serves."""

    def __init__(self, data_dir: Path, *, ports_from: MakeRun | None = None, **env: str) -> None:
        self.data_dir = data_dir
        self.mark = uuid.uuid4().hex
        self.gateway_id = f"mk-{self.mark[:8]}"
        if ports_from is None:
            tcp, udp = socket.SOCK_STREAM, socket.SOCK_DGRAM
            picked, self.device_port = free_broker_ports(tcp, tcp, udp)
            self.mqtt_port, self.http_port, self.admin_port, self.udp_port = picked
        else:
            self.mqtt_port, self.http_port = ports_from.mqtt_port, ports_from.http_port
            self.admin_port, self.udp_port = ports_from.admin_port, ports_from.udp_port
            self.device_port = ports_from.device_port
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SNLPGW_")}
        self.env.update(
            {
                MARK_VAR: self.mark,
                "SNLPGW_GATEWAY_ID": self.gateway_id,
                "SNLPGW_DATA_DIR": str(data_dir),
                "SNLPGW_MQTT__URL": f"mqtt://127.0.0.1:{self.mqtt_port}",
                "SNLPGW_HTTP__PORT": str(self.http_port),
                "SNLPGW_HTTP__ADMIN_PORT": str(self.admin_port),
                "SNLPGW_HTTP__CONSOLE_PORT": "0",  # tests share the machine: any free port
                "SNLPGW_UDP__PORT": str(self.udp_port),
                "SNLPGW_ASR__ENGINE": "none",
                "SNLPGW_OPS__SHUTDOWN_TIMEOUT_S": "3",
            }
        )
        self.env.update(env)
        self.proc: subprocess.Popen[bytes] | None = None
        self.output = bytearray()
        self._changed = threading.Condition()
        self._stop_reading = threading.Event()
        self._reader: threading.Thread | None = None
        self._master: int | None = None

    # -- starting ------------------------------------------------------------------------------

    def spawn(self, *, tty: bool = False) -> None:
        if tty:
            self._master, slave = os.openpty()

            def setup() -> None:
                os.setsid()
                fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # make leads a session with this terminal
                _default_signals()

            self.proc = subprocess.Popen(
                ["make", "--no-print-directory", "run"],
                cwd=ROOT,
                env=self.env,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                preexec_fn=setup,  # noqa: PLW1509 - setsid, ioctl, sigaction: no locks taken
            )
            os.close(slave)
            source = self._master
        else:
            self.proc = subprocess.Popen(
                ["make", "--no-print-directory", "run"],
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # make leads its own process group, as in a shell job
                preexec_fn=_default_signals,  # noqa: PLW1509 - sigaction only: no locks taken
            )
            assert self.proc.stdout is not None
            source = self.proc.stdout.fileno()
        self._reader = threading.Thread(target=self._drain, args=(source,), daemon=True)
        self._reader.start()

    def start(self, *, tty: bool = False) -> None:
        self.spawn(tty=tty)
        ready = (b"connected to broker", b"(devices) listening", b"(admin) listening")
        self.wait_output(lambda out: all(line in out for line in ready))

    def _drain(self, fd: int) -> None:
        while not self._stop_reading.is_set():
            ready, _, _ = select.select([fd], [], [], 0.1)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the terminal's other side is gone
                chunk = b""
            with self._changed:
                self.output.extend(chunk)
                self._changed.notify_all()
            if not chunk:
                return

    def wait_output(self, done: Callable[[bytes], bool], wait_s: float = READY_S) -> None:
        with self._changed:
            ok = self._changed.wait_for(
                lambda: done(bytes(self.output)) or self._reader_done(), wait_s
            )
            if not ok or not done(bytes(self.output)):
                raise AssertionError(f"make run output:\n{self.text()[-4000:]}")

    def _reader_done(self) -> bool:
        return self._reader is not None and not self._reader.is_alive()

    def text(self) -> str:
        return self.output.decode(errors="replace")

    @property
    def supervisor_pid(self) -> int:
        info = json.loads((self.data_dir / "dev-run.lock").read_text())
        return int(info["pid"])

    # -- stopping ------------------------------------------------------------------------------

    def close_terminal(self) -> None:
        assert self._master is not None
        self._stop_reading.set()
        assert self._reader is not None
        self._reader.join()
        os.close(self._master)
        self._master = None

    def wait_exit(self) -> int:
        assert self.proc is not None
        code = self.proc.wait(timeout=STOP_S)
        if self._master is None and self._reader is not None:
            self._reader.join(timeout=STOP_S)
        return code

    def ports_free(self) -> bool:
        return (
            port_free("127.0.0.1", self.mqtt_port, "tcp")
            and port_free("127.0.0.1", self.device_port, "tcp")
            and port_free("127.0.0.1", self.http_port, "tcp")
            and port_free("127.0.0.1", self.admin_port, "tcp")
            and port_free("127.0.0.1", self.udp_port, "udp")
        )

    def cleanup(self) -> None:
        """Last resort after a failed test: nothing of this session may outlive it."""
        for pid in session_pids(self.mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.wait(timeout=STOP_S)
        self._stop_reading.set()
        if self._master is not None:
            os.close(self._master)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


class StatusWatcher:
    """Subscribes (as the gateway user) to the gateway's retained presence topic."""

    def __init__(self, run: MakeRun) -> None:
        self.online: list[bool] = []
        self.seen_online = threading.Event()  # the retained `online: true`: we are subscribed
        self.offline = threading.Event()
        password = (run.data_dir / "secrets" / "gateway.password").read_text().strip()
        self._client = Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"watch-{run.mark[:8]}",
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        self._client.username_pw_set("snlp-gateway", password)
        topic = f"snlpgw/v1/gw/{run.gateway_id}/status"
        self._client.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
        self._client.on_message = self._on_message
        self._client.connect("127.0.0.1", run.mqtt_port, keepalive=10)
        self._client.loop_start()

    def _on_message(self, _c: Client, _u: object, msg: MQTTMessage) -> None:
        online = bool(json.loads(msg.payload)["online"])
        self.online.append(online)
        (self.offline if not online else self.seen_online).set()

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()
