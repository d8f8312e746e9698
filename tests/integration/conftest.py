"""Fixtures for integration tests against a real Mosquitto (see tests/support/broker.py).

* ``broker`` — one broker for the session, project config (auth + ACL). Do not stop it.
* ``fresh_broker`` — a broker of its own for one test; ``stop()`` / ``start()`` freely
  (restarts keep the port and the data dir).
* ``device_id`` — a unique random board id (``aa_bb_cc_dd_ee_ff`` form) per test, so each
  test has its own topic prefix on the shared broker.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import Broker, new_device_id, start_broker


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    running = start_broker(Path(tmp_path_factory.mktemp("broker")))
    yield running
    running.stop()


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[Broker]:
    running = start_broker(tmp_path / "data")
    yield running
    running.stop()


@pytest.fixture
def device_id() -> str:
    return new_device_id()
