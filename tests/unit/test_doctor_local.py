"""snlpgw doctor: the table, and the checks that need no running system."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

from gateway.doctor.local import check_audio_libs, check_clock, check_store
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
