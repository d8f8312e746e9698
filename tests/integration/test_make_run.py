"""`make run` stops broker and gateway on every signal a user, a terminal or a supervisor sends.

Each test runs the real `make run` (make → `snlpgw dev-run` → Mosquitto + `snlpgw run`) on free
ports and a data dir of its own, signals it one way, and checks: make exits, no process of the
session survives (found by an inherited marker variable, wherever it was re-parented), all five
ports are free, and the gateway's retained `online: false` reached the broker before it stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.mqtt.probe import connack
from tests.support.make_run import ROOT, STOP_S, MakeRun, StatusWatcher, session_pids

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

NOT_AUTHORIZED = 135


@pytest.fixture
def make_run(tmp_path: Path) -> Iterator[MakeRun]:
    run = MakeRun(tmp_path / "data")
    yield run
    run.cleanup()


def _assert_all_stopped(run: MakeRun, watcher: StatusWatcher) -> None:
    assert watcher.offline.wait(STOP_S), f"no online:false seen; output:\n{run.text()[-3000:]}"
    watcher.close()
    run.wait_exit()  # its code depends on how make was signalled
    assert session_pids(run.mark) == set(), run.text()[-3000:]
    assert run.ports_free()
    assert "Traceback" not in run.text()


def _started(run: MakeRun, *, tty: bool = False) -> StatusWatcher:
    run.start(tty=tty)
    # make, dev-run, mosquitto and the gateway carry the marker: the survivor check can fail.
    assert len(session_pids(run.mark)) >= 4
    watcher = StatusWatcher(run)
    assert watcher.seen_online.wait(STOP_S)
    return watcher


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name
)
@pytest.mark.parametrize("target", ["group", "make"])
def test_a_signal_stops_gateway_then_broker(
    make_run: MakeRun, sig: signal.Signals, target: str
) -> None:
    watcher = _started(make_run)
    assert make_run.proc is not None
    if target == "group":  # Ctrl-C, `timeout`, CI runners and process managers do this
        os.killpg(make_run.proc.pid, sig)
    else:  # `kill -INT <make pid>`: GNU make itself passes only SIGTERM on
        os.kill(make_run.proc.pid, sig)
    _assert_all_stopped(make_run, watcher)
    assert "stopping the gateway, then the broker" in make_run.text()


def test_closing_the_terminal_stops_everything(make_run: MakeRun) -> None:
    watcher = _started(make_run, tty=True)
    make_run.close_terminal()  # the pty's master closes: the kernel hangs up make's session
    _assert_all_stopped(make_run, watcher)


def _make_run_once(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A second ``make run`` in the foreground: it is expected to refuse at once."""
    return subprocess.run(
        ["make", "--no-print-directory", "run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=STOP_S,
        check=False,
    )


def test_second_instance_names_pid_and_ports(make_run: MakeRun, tmp_path: Path) -> None:
    watcher = _started(make_run)
    first_pid = make_run.supervisor_pid

    same = _make_run_once(make_run.env)
    assert same.returncode != 0
    assert f"already running as pid {first_pid}" in same.stderr
    assert f"127.0.0.1:{make_run.mqtt_port}" in same.stderr
    assert f"127.0.0.1:{make_run.device_port}" in same.stderr  # the devices' listener
    assert f"127.0.0.1:{make_run.http_port}" in same.stderr
    assert "Traceback" not in same.stderr

    other = MakeRun(tmp_path / "other", ports_from=make_run)  # another data dir, same ports
    taken = _make_run_once(other.env)
    assert taken.returncode != 0
    assert f"broker 127.0.0.1:{make_run.mqtt_port}/tcp is in use by pid" in taken.stderr
    assert "(mosquitto)" in taken.stderr
    assert "Traceback" not in taken.stderr
    assert session_pids(other.mark) == set()

    assert make_run.proc is not None
    os.killpg(make_run.proc.pid, signal.SIGTERM)
    _assert_all_stopped(make_run, watcher)


def test_a_gateway_that_cannot_start_takes_the_broker_down(tmp_path: Path) -> None:
    run = MakeRun(tmp_path / "data", SNLPGW_RUNTIME__CATALOG_PATH=str(tmp_path / "missing"))
    try:
        run.spawn()
        assert run.wait_exit() != 0
        assert "gateway exited; stopping the gateway, then the broker" in run.text()
        assert session_pids(run.mark) == set(), run.text()[-3000:]
        assert run.ports_free()
    finally:
        run.cleanup()


def test_ota_sends_boards_to_the_devices_listener(make_run: MakeRun) -> None:
    """`make run` starts the production shape: OTA answers with the devices' listener, where the
    board's credentials work, and the gateway's listener refuses them."""
    watcher = _started(make_run)
    headers = {
        "Device-Id": "24:0a:c4:12:34:56",
        "Client-Id": str(uuid.uuid4()),
        "User-Agent": "bread-compact-wifi/2.4.2",
        "Content-Type": "application/json",
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{make_run.http_port}/xiaozhi/ota/", data=b"{}", headers=headers
    )
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
        mqtt = json.loads(answer.read())["mqtt"]
    assert mqtt["endpoint"] == f"127.0.0.1:{make_run.device_port}"
    user, password = mqtt["username"], mqtt["password"]
    assert connack("127.0.0.1", make_run.device_port, user, password) == 0
    assert connack("127.0.0.1", make_run.mqtt_port, user, password) == NOT_AUTHORIZED
    assert make_run.proc is not None
    os.killpg(make_run.proc.pid, signal.SIGTERM)
    _assert_all_stopped(make_run, watcher)
