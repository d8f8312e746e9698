"""The store tests run against both backends: embedded SQLite and a real PostgreSQL.

``new_connector()`` gives a connector to a fresh, empty database of the test's backend (a new
SQLite file, or a new database on the session's PostgreSQL, see tests/support/postgres.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.store.dialect import Connector, file_connection, postgres_connection

NewConnector = Callable[[], Connector]

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.integration),
]


@pytest.fixture(params=BACKENDS)
def new_connector(request: pytest.FixtureRequest, tmp_path: Path) -> NewConnector:
    if request.param == "sqlite":
        counter = itertools.count()
        return lambda: file_connection(tmp_path / f"g{next(counter)}.sqlite3")
    postgres = request.getfixturevalue("postgres")
    return lambda: postgres_connection(postgres.new_database())


@pytest.fixture
def connector(new_connector: NewConnector) -> Connector:
    """One fresh database for the test."""
    return new_connector()
