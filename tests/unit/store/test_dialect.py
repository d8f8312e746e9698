"""``store.url`` → which database, and the one SQL text serving both dialects."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.settings import Settings
from gateway.store.dialect import Dialect, connector_for, redact


def test_default_is_the_embedded_sqlite_file(tmp_path: Path) -> None:
    connector = connector_for(None, tmp_path / "g.sqlite3")
    assert connector.dialect is Dialect.SQLITE
    assert connector.where == str(tmp_path / "g.sqlite3")


@pytest.mark.parametrize(
    ("url", "where"),
    [("sqlite:///rel/g.db", "rel/g.db"), ("sqlite:////abs/g.db", "/abs/g.db")],
)
def test_sqlite_urls_follow_the_usual_slash_convention(url: str, where: str) -> None:
    connector = connector_for(url, Path("unused"))
    assert (connector.dialect, connector.where) == (Dialect.SQLITE, where)


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_postgres_url_password_never_reaches_the_logs(scheme: str) -> None:
    connector = connector_for(f"{scheme}://gw:s3cret@db.example:5433/snlp", Path("unused"))
    assert connector.dialect is Dialect.POSTGRESQL
    assert "s3cret" not in connector.where
    assert connector.where == f"{scheme}://gw:***@db.example:5433/snlp"
    assert redact("postgresql://db/snlp") == "postgresql://db/snlp"


def test_unknown_scheme_is_refused_by_settings_and_connector() -> None:
    with pytest.raises(ValueError, match="unsupported"):
        connector_for("mysql://db/x", Path("unused"))
    with pytest.raises(ValueError, match="postgresql"):
        Settings(store={"url": "mysql://db/x"})
    assert Settings(store={"url": "postgresql://db/x"}).store.url == "postgresql://db/x"


def test_placeholders_per_dialect() -> None:
    sql = "SELECT a FROM t WHERE b = ? AND c = ?"
    assert Dialect.SQLITE.sql(sql) == sql
    assert Dialect.POSTGRESQL.sql(sql) == "SELECT a FROM t WHERE b = %s AND c = %s"
