"""`snlpgw run` as a process, as `make run` starts it: connects, serves, stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devstack.broker import free_port
from tests.support.broker import Broker

ROOT = Path(__file__).parents[2]
# Hang guards, not timings: `snlpgw run` imports numpy, libopus, aiohttp, pydantic… before it
# logs anything, and on two cores shared with a CPU hog that alone took over 20 s.
START_S = 120.0
pytestmark = pytest.mark.timeout(2 * START_S + 60)


def _env(broker: Broker, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNLPGW_")}
    env.update(
        SNLPGW_GATEWAY_ID=f"cli-{tmp_path.name[-8:]}".replace(".", "-"),
        SNLPGW_DATA_DIR=str(tmp_path),
        SNLPGW_MQTT__URL=broker.url,
        SNLPGW_MQTT__PASSWORD=broker.gateway_credentials().password or "",
        SNLPGW_HTTP__PORT=str(free_port()),
        SNLPGW_HTTP__ADMIN_PORT="0",
        SNLPGW_UDP__PORT="0",
        SNLPGW_OPS__LOG_JSON="true",
        SNLPGW_ASR__ENGINE="none",
    )
    env.update(extra)
    return env


def _wait_for_line(proc: subprocess.Popen[str], needle: str, wait_s: float = START_S) -> list[str]:
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return seen
    raise AssertionError(f"{needle!r} not logged; got: {''.join(seen)[-2000:]}")


def test_run_connects_and_stops_cleanly_on_sigterm(broker: Broker, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "run"],
        cwd=ROOT,
        env=_env(broker, tmp_path),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        lines = _wait_for_line(proc, "connected to broker")
        assert all(line.startswith("{") for line in lines)  # JSON log lines
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=START_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert '"msg": "stopped"' in rest
    password = broker.gateway_credentials().password
    assert password is not None
    assert password not in "".join(lines) + rest  # no secrets in logs


def test_run_says_clearly_when_its_port_is_taken(broker: Broker, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "gateway", "run"],
            cwd=ROOT,
            env=_env(broker, tmp_path, SNLPGW_HTTP__PORT=str(port)),
            capture_output=True,
            text=True,
            timeout=START_S,
            check=False,
        )
    assert result.returncode == 2
    assert "snlpgw: cannot start:" in result.stderr
    assert "Traceback" not in result.stderr
