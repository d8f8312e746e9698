"""Test hygiene shared by every tier."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator

import pytest

from devstack.broker import PORT_SLICE_VAR
from tests.support.postgres import Postgres, start_postgres


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "allow_task_leak: the test deliberately leaves tasks behind")
    # Under pytest-xdist (`make test` runs the suite in parallel workers, docs/testing.md) each
    # worker picks free ports from a range of its own: a port one worker picked and released
    # before its server binds it (or while a broker restarts on it) is never another's pick.
    worker, count = (
        os.environ.get("PYTEST_XDIST_WORKER", ""),
        os.environ.get("PYTEST_XDIST_WORKER_COUNT", ""),
    )
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit():
        os.environ[PORT_SLICE_VAR] = f"{worker[2:]}/{count}"


@pytest.fixture(autouse=True)
async def _no_leaked_tasks(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Fail any test that leaves tasks running on its loop (STYLE.md: every task owned)."""
    before = set(asyncio.all_tasks())
    yield
    if request.node.get_closest_marker("allow_task_leak"):
        return
    await asyncio.sleep(0)  # let tasks cancelled at the test's end finish unwinding
    current = asyncio.current_task()
    leaked = [t for t in asyncio.all_tasks() - before if t is not current and not t.done()]
    if leaked:
        for t in leaked:
            t.cancel()
        names = ", ".join(sorted(t.get_name() for t in leaked))
        pytest.fail(f"test left {len(leaked)} task(s) running: {names}")


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """One real PostgreSQL for the session (started only when a test asks for it)."""
    running = start_postgres()
    yield running
    running.stop()
