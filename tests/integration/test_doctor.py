"""`snlpgw doctor` against a real Mosquitto and a running gateway process: all green, then one
thing broken at a time (wrong password, store directory read-only, broker down) makes the right
row fail and the exit code non-zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from devstack.broker import free_port
from tests.support.asr_server import AsrServer
from tests.support.broker import Broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).parents[2]
READY = (b"connected to broker", b"(devices) listening", b"(admin) listening")


def _env(broker: Broker, tmp_path: Path, asr_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNLPGW_")}
    env.update(
        SNLPGW_GATEWAY_ID=f"doc-{os.getpid()}",
        SNLPGW_DATA_DIR=str(broker.data_dir),  # the broker's files: the ACL check provisions
        SNLPGW_MQTT__URL=broker.url,
        SNLPGW_HTTP__PORT=str(free_port()),
        SNLPGW_HTTP__ADMIN_PORT=str(free_port()),
        SNLPGW_UDP__PORT=str(free_port(socket.SOCK_DGRAM)),
        SNLPGW_STORE__SQLITE_PATH=str(tmp_path / "store" / "gateway.sqlite3"),
        SNLPGW_ASR__ENGINE="http",
        SNLPGW_ASR__HTTP_URL=asr_url,
    )
    return env


@contextlib.asynccontextmanager
async def gateway_process(env: dict[str, str]) -> AsyncIterator[None]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "run",
        cwd=ROOT, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    seen = b""
    try:
        async with asyncio.timeout(60):
            while not all(needle in seen for needle in READY):
                line = await proc.stderr.readline()
                assert line, seen.decode(errors="replace")
                seen += line
        async with asyncio.TaskGroup() as tg:
            drain = tg.create_task(proc.stderr.read(), name="test.gateway-stderr")
            try:
                yield
            finally:
                proc.send_signal(signal.SIGTERM)
                async with asyncio.timeout(30):
                    await proc.wait()
                await drain
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


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
        env = _env(fresh_broker, tmp_path, asr.url)
        async with gateway_process(env):
            code, rows, text = await doctor(env)
            assert code == 0, text
            assert set(rows.values()) == {"ok"}, text
            assert len(rows) == 10, text
            assert asr.requests, "the ASR row must really call the engine"
            users = (fresh_broker.data_dir / "mosquitto" / "users.json").read_text()
            assert '"device"' not in users  # the throwaway device was revoked

            code, rows, text = await doctor({**env, "SNLPGW_MQTT__PASSWORD": "wrong"})
            assert code == 1, text
            assert rows["broker credentials"] == "FAIL", text
            assert rows["ACL isolation"] == "skip", text
            assert rows["broker reachable"] == rows["gateway health"] == "ok", text

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
