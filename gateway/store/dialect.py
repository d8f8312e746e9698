"""Which database the store talks to: SQLite (embedded default) or PostgreSQL (shared by many
gateways), chosen by ``store.url``. Everything else in the store is the same SQL.

A :class:`Connector` is a dialect plus a factory opening one DB-API connection in autocommit
mode (the store issues ``BEGIN``/``COMMIT`` itself). Tests inject their own factories.

PostgreSQL goes through psycopg 3's synchronous API: the store already owns one dedicated
thread and one connection (see ``worker.py``), which is exactly psycopg's blocking model.
"""

from __future__ import annotations

import enum
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

# A DB-API connection (sqlite3 or psycopg): ``execute(sql, params)`` returning a cursor with
# ``fetchall``/``fetchone``, and ``close``. Typed loosely: the two drivers' stubs disagree on
# the SQL argument's type (psycopg wants a LiteralString; ours are module constants).
Connection = Any


class Dialect(enum.Enum):
    SQLITE = "sqlite"
    POSTGRESQL = "postgresql"

    def sql(self, text: str) -> str:
        """``text`` is written with ``?`` placeholders; psycopg's are ``%s``."""
        return text if self is Dialect.SQLITE else text.replace("?", "%s")

    @property
    def errors(self) -> tuple[type[Exception], ...]:
        if self is Dialect.SQLITE:
            return (sqlite3.Error,)
        import psycopg  # noqa: PLC0415  # only a PostgreSQL store needs the driver

        return (psycopg.Error,)


@dataclass(frozen=True)
class Connector:
    dialect: Dialect
    connect: Callable[[], Connection]
    where: str  # for logs: a path or a URL without its password


def sqlite_connector(connect: Callable[[], sqlite3.Connection], where: str = "?") -> Connector:
    return Connector(Dialect.SQLITE, connect, where)


def file_connection(path: Path) -> Connector:
    """SQLite file: create the parent directory, WAL mode, autocommit (we BEGIN)."""

    def connect() -> sqlite3.Connection:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=5.0)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        return conn

    return Connector(Dialect.SQLITE, connect, str(path))


def postgres_connection(url: str, *, connect_timeout_s: int = 5) -> Connector:
    """PostgreSQL at ``url`` (``postgresql://user:pass@host:port/db``), autocommit."""

    def connect() -> Connection:
        import psycopg  # noqa: PLC0415  # only a PostgreSQL store needs the driver

        return psycopg.connect(url, autocommit=True, connect_timeout=connect_timeout_s)

    return Connector(Dialect.POSTGRESQL, connect, redact(url))


def connector_for(url: str | None, sqlite_path: Path) -> Connector:
    """``store.url``: unset or ``sqlite:///path`` → SQLite; ``postgresql://…`` → PostgreSQL."""
    if url is None:
        return file_connection(sqlite_path)
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        # sqlite:///relative/file or sqlite:////absolute/file (SQLAlchemy's convention)
        return file_connection(Path(url.removeprefix("sqlite://").removeprefix("/")))
    if scheme in ("postgresql", "postgres"):
        return postgres_connection(url)
    raise ValueError(f"store.url: unsupported scheme {scheme!r}")


def redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
