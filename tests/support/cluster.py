"""Gateway *processes* for the scale-out tests: each one ``python -m gateway --config … run``
with its own id, data dir, ephemeral ports and log file, all on one broker and one store.

A process is killed with SIGKILL (no shutdown path: the broker publishes its LWT). The
ownership log is read back from each log file: the task runtime logs ``ownership gained DEV
at_ms=T`` when it starts acting for a device and ``ownership released DEV at_ms=T`` when it
stops (gateway/tasks/service.py).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.broker import Broker

OWNERSHIP = re.compile(r"ownership (gained|released) (\S+) at_ms=(\d+)")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string is a JSON string


def write_toml(path: Path, settings: dict[str, Any]) -> Path:
    top = [f"{k} = {_toml_value(v)}" for k, v in settings.items() if not isinstance(v, dict)]
    sections = []
    for name, body in settings.items():
        if isinstance(body, dict):
            lines = "\n".join(f"{k} = {_toml_value(v)}" for k, v in body.items())
            sections.append(f"[{name}]\n{lines}")
    path.write_text("\n".join(top) + "\n\n" + "\n\n".join(sections) + "\n", encoding="utf-8")
    return path


@dataclass
class GatewayProcess:
    gateway_id: str
    root: Path
    sections: dict[str, Any]
    proc: subprocess.Popen[bytes] | None = None
    killed_at_ms: int | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.log_path = self.root / "gateway.log"

    def start(self) -> None:
        settings = {"gateway_id": self.gateway_id, "data_dir": str(self.root / "data")}
        config = write_toml(self.root / "gateway.toml", {**settings, **self.sections})
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "--config", str(config), "run"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )

    def kill(self) -> None:
        """SIGKILL: the process ends at once; the broker writes its LWT."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.killed_at_ms = time.time_ns() // 1_000_000

    def terminate(self) -> None:
        """SIGTERM (graceful shutdown); :meth:`wait` for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def wait(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None and self.killed_at_ms is None:
            raise AssertionError(
                f"{self.gateway_id} exited ({self.proc.returncode}): {self.tail()}"
            )

    def tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def ownership(self) -> list[tuple[str, str, int]]:
        """``(event, device, at_ms)`` in log order."""
        text = self.log_path.read_text(errors="replace")
        return [(m[1], m[2], int(m[3])) for m in OWNERSHIP.finditer(text)]


def cluster_sections(
    broker: Broker, *, store_url: str, catalog: Path, min_window_ms: int, heartbeat_s: float
) -> dict[str, Any]:
    """Settings every gateway of the test cluster shares (ids and data dirs are per process)."""
    return {
        "mqtt": {
            "url": broker.url,
            "password": broker.gateway_credentials().password,
            "reconnect_min_s": 0.05,
            "reconnect_max_s": 0.5,
        },
        "http": {"port": 0, "admin_port": 0},
        "udp": {"port": 0},
        "store": {"url": store_url},
        "cluster": {"enabled": True, "handover_delay_s": 1.0},
        "asr": {"engine": "none"},
        # generous: on two busy cores a board's audio.completed can take seconds to be handled,
        # and the test is about ownership, not the clip watchdog
        "runtime": {
            "catalog_path": str(catalog),
            "min_window_ms": min_window_ms,
            "completion_grace_ms": 60_000,
        },
        "board": {"heartbeat_s": heartbeat_s},
        "ops": {"metrics_interval_s": 0.5, "shutdown_timeout_s": 3.0, "log_level": "INFO"},
    }


def intervals(gateways: list[GatewayProcess], end_ms: int) -> dict[str, list[tuple[int, int, str]]]:
    """Per device, the ``(from_ms, to_ms, gateway)`` spans during which a gateway acted for it
    up to ``end_ms`` (what the shutdown of the test cluster moves later is not looked at); a span
    still open ends at the gateway's kill time, else at ``end_ms``."""
    spans: dict[str, list[tuple[int, int, str]]] = {}
    for gw in gateways:
        open_since: dict[str, int] = {}
        for event, dev, at in gw.ownership():
            if at > end_ms:
                break
            if event == "gained":
                assert dev not in open_since, f"{gw.gateway_id} gained {dev} twice"
                open_since[dev] = at
            else:
                start = open_since.pop(dev)
                spans.setdefault(dev, []).append((start, at, gw.gateway_id))
        for dev, start in open_since.items():
            spans.setdefault(dev, []).append((start, gw.killed_at_ms or end_ms, gw.gateway_id))
    return spans
