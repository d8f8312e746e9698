"""Shared by the store tests: a real service context (no broker needed) and metric reads."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gateway.metrics import Metrics
from gateway.service import Context
from gateway.settings import Settings


def make_context(tmp_path: Path) -> Context:
    """A real service context (real HttpServers on ephemeral ports, real Ops); its MQTT is not
    run, so ops alarms are only queued and counted."""
    settings = Settings(
        gateway_id="gw-test",
        data_dir=tmp_path,
        mqtt={"password": "unused"},
        http={"host": "127.0.0.1", "port": 0, "admin_port": 0},
    )
    return Context.create(settings)


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(f"snlpgw_{name}", labels)
    return 0.0 if value is None else value


def read_only(path: Path) -> sqlite3.Connection:
    """A real read-only connection: every write fails inside SQLite (works even as root)."""
    return sqlite3.connect(
        f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
    )
