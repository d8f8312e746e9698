from __future__ import annotations

import json
import logging

import pytest

from gateway.logs import DeviceLog, setup_logging, truncate


def test_truncate_bounds_payloads_in_log_lines() -> None:
    assert truncate(b"abc") == "abc"
    assert truncate("x" * 250) == "x" * 200 + "…(+50)"
    assert truncate(b"\xff\xfe") == "\ufffd\ufffd"


def test_json_lines_carry_the_bound_device(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("INFO", json_lines=True)
        DeviceLog(logging.getLogger("t"), {"device": "aa_bb_cc_dd_ee_ff"}).info("hello %d", 1)
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert line["device"] == "aa_bb_cc_dd_ee_ff"
    assert line["msg"] == "[device=aa_bb_cc_dd_ee_ff] hello 1"
    assert line["level"] == "INFO"
