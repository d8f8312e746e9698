"""Test hygiene shared by every tier."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from tests.support.postgres import Postgres, start_postgres


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "allow_task_leak: the test deliberately leaves tasks behind")


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
