"""snlpgw doctor: the table, and the checks that need no running system."""

from __future__ import annotations

import logging
import socket
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import pytest

from gateway.cli.main import main as cli_main
from gateway.doctor.local import check_audio_libs, check_clock, check_store
from gateway.doctor.network import Findings, check_broker, check_secret
from gateway.doctor.report import Status, exit_code, fail, ok, render, skip
from gateway.settings import load_settings


def test_table_and_exit_code() -> None:
    rows = [ok("broker reachable", "x"), skip("ACL isolation", "y"), fail("clock", "z")]
    text = render(rows)
    assert text.splitlines()[0].split() == ["check", "status", "detail"]
    assert "clock             FAIL    z" in text
    assert text.endswith("1 check(s) failed\n")
    assert exit_code(rows) == 1
    assert exit_code(rows[:2]) == 0
    assert render(rows[:2]).endswith("all checks passed\n")


def test_clock_compares_with_the_gateways_date() -> None:
    now = datetime.now(UTC)
    assert check_clock(None).status is Status.OK
    assert check_clock(format_datetime(now, usegmt=True)).status is Status.OK
    skewed = check_clock(format_datetime(now - timedelta(seconds=60), usegmt=True))
    assert skewed.status is Status.FAIL
    assert "s behind ours" in skewed.detail  # HTTP Date has whole seconds: 60 or 61 s


def test_store_check_writes_and_names_the_file(tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path, store={"sqlite_path": tmp_path / "s" / "g.db"})
    row = check_store(settings)
    assert row.status is Status.OK, row
    assert str(tmp_path / "s" / "g.db") in row.detail


def test_audio_libraries_load() -> None:
    assert check_audio_libs().status is Status.OK


def test_clock_skew_is_taken_when_the_date_arrived_not_when_checked() -> None:
    seen = datetime.now(UTC) - timedelta(seconds=30)  # the health check ran 30 s ago
    assert check_clock(format_datetime(seen, usegmt=True), seen).status is Status.OK
    late = check_clock(format_datetime(seen - timedelta(seconds=60), usegmt=True), seen)
    assert late.status is Status.FAIL


def test_gateway_secret_row_says_where_the_password_comes_from(tmp_path: Path) -> None:
    shared = tmp_path / "gateway.password"
    shared.write_text("s3cret\n")
    row = check_secret(load_settings(data_dir=str(tmp_path), mqtt={"password_file": str(shared)}))
    assert (row.status, row.detail) == (Status.OK, f"from mqtt.password_file {shared}")
    assert "s3cret" not in row.detail
    row = check_secret(load_settings(data_dir=str(tmp_path), mqtt={"password": "s3cret"}))
    assert (row.status, row.detail) == (Status.OK, "from mqtt.password")


def test_gateway_secret_row_names_a_missing_or_empty_secret_and_the_setting(
    tmp_path: Path,
) -> None:
    row = check_secret(load_settings(data_dir=str(tmp_path)))
    assert row.status is Status.FAIL
    assert f"{tmp_path}/secrets/gateway.password missing" in row.detail
    assert "SNLPGW_MQTT__PASSWORD_FILE" in row.detail
    empty = tmp_path / "empty"
    empty.write_text("")
    row = check_secret(load_settings(data_dir=str(tmp_path), mqtt={"password_file": str(empty)}))
    assert (row.status, row.detail) == (Status.FAIL, f"mqtt.password_file {empty} is empty")


def test_no_secret_skips_the_login_instead_of_trying_without_one(tmp_path: Path) -> None:
    """With no password the broker row still runs (reachability), the login is skipped."""
    with socket.socket() as listener:  # a "broker" that accepts TCP
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        settings = load_settings(data_dir=str(tmp_path), mqtt={"url": f"mqtt://127.0.0.1:{port}"})
        rows = check_broker(settings, Findings())
    assert [(r.check, r.status) for r in rows] == [
        ("broker reachable", Status.OK),
        ("broker credentials", Status.SKIP),
    ]
    assert rows[1].detail == "no gateway password (see gateway secret)"


def test_run_refuses_to_start_when_the_configured_password_file_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    absent = tmp_path / "absent.password"
    monkeypatch.setenv("SNLPGW_MQTT__PASSWORD_FILE", str(absent))
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:  # `run` sets up logging on this test's captured stderr: not left for later tests
        assert cli_main(["run", "--data-dir", str(tmp_path)]) == 2
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    assert capsys.readouterr().err == (
        f"snlpgw: cannot start: mqtt.password_file {absent} missing\n"
    )
