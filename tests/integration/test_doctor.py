"""`snlpgw doctor` against a real Mosquitto and a running gateway process (the dev stack's
:func:`devstack.process.gateway_process`): all green, then one thing broken at a time (wrong
password, a missing password file, store directory read-only, broker down) makes the right row fail and the exit code
non-zero.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from devstack.broker import free_ports
from devstack.process import gateway_process
from tests.support.asr_server import AsrServer
from tests.support.broker import Broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).parents[2]


def _sections(broker: Broker, tmp_path: Path, asr_url: str) -> dict[str, Any]:
    """Fixed free ports: the doctor is told the same settings and probes them."""
    http, admin, udp = free_ports(socket.SOCK_STREAM, socket.SOCK_STREAM, socket.SOCK_DGRAM)
    return {
        "gateway_id": f"doc-{os.getpid()}",
        "data_dir": str(broker.data_dir),  # the broker's files: the ACL check provisions
        "mqtt": {"url": broker.url},
        "http": {"port": http, "admin_port": admin, "console_port": 0},
        "udp": {"port": udp},
        "store": {"sqlite_path": str(tmp_path / "store" / "gateway.sqlite3")},
        "asr": {"engine": "http", "http_url": asr_url},
    }


def _env(sections: dict[str, Any]) -> dict[str, str]:
    """The same settings as ``SNLPGW_*`` variables (how the doctor is configured here)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNLPGW_")}
    for name, value in sections.items():
        if isinstance(value, dict):
            env.update({f"SNLPGW_{name}__{k}".upper(): str(v) for k, v in value.items()})
        else:
            env[f"SNLPGW_{name}".upper()] = str(value)
    return env


async def doctor(env: dict[str, str], *wrap: str) -> tuple[int, dict[str, str], str]:
    argv = [*wrap, sys.executable, "-m", "gateway", "doctor"]
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(120):
        out, err = await proc.communicate()
    text = out.decode()
    rows = {}
    for line in text.splitlines()[1:-1]:
        check, _, rest = line.partition("  ")
        rows[check.strip()] = rest.split()[0]
    assert proc.returncode is not None
    return proc.returncode, rows, text + err.decode()


def _read_only(path: Path) -> tuple[str, ...]:
    """Run the doctor with ``path`` read-only: a read-only bind mount as root (who ignores
    permission bits), mode 0555 otherwise."""
    if os.geteuid() == 0:
        return ("unshare", "-m", "sh", "-c", f'mount --bind -o ro {path} {path} && exec "$@"', "-")
    path.chmod(0o555)
    return ()


async def test_doctor_green_then_each_breakage_fails_its_row(
    fresh_broker: Broker, tmp_path: Path
) -> None:
    async with AsrServer(lambda pcm: "hello") as asr:
        sections = _sections(fresh_broker, tmp_path, asr.url)
        env = _env(sections)
        async with gateway_process(tmp_path / "gateway", sections):
            code, rows, text = await doctor(env)
            assert code == 0, text
            assert set(rows.values()) == {"ok"}, text
            assert len(rows) == 12, text
            assert asr.requests, "the ASR row must really call the engine"
            users = (fresh_broker.data_dir / "mosquitto" / "users.json").read_text()
            assert '"device"' not in users  # the throwaway device was revoked

            code, rows, text = await doctor({**env, "SNLPGW_MQTT__PASSWORD": "wrong"})
            assert code == 1, text
            assert rows["broker credentials"] == "FAIL", text
            assert rows["ACL isolation"] == "skip", text
            assert rows["broker reachable"] == rows["gateway health"] == "ok", text

            absent = tmp_path / "absent.password"
            code, rows, text = await doctor({**env, "SNLPGW_MQTT__PASSWORD_FILE": str(absent)})
            assert code == 1, text
            assert rows["gateway secret"] == "FAIL", text
            assert f"mqtt.password_file {absent} missing" in text
            assert rows["broker credentials"] == rows["ACL isolation"] == "skip", text

            store = tmp_path / "store"
            code, rows, text = await doctor(env, *_read_only(store))
            store.chmod(0o755)
            assert code == 1, text
            assert rows["store writable"] == "FAIL", text
            assert [c for c, s in rows.items() if s != "ok"] == ["store writable"], text

            fresh_broker.stop()
            code, rows, text = await doctor(env)
            assert code == 1, text
            assert rows["broker reachable"] == "FAIL", text
            assert rows["broker credentials"] == rows["ACL isolation"] == "skip", text
            assert rows["store writable"] == rows["UDP audio port"] == "ok", text
