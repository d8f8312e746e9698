"""Console accounts on a real store, SQLite and PostgreSQL (migration 0004): users, grants,
sessions; and the CLI's ``snlpgw user add|passwd|remove`` (on the embedded SQLite)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.cli.main import main
from gateway.console.accounts import (
    AccountBook,
    AccountError,
    ConsoleRole,
    DeviceGrant,
    csrf_ok,
    parse_grant,
    verify_password,
)
from gateway.store import Store
from gateway.store.dialect import Connector

PASSWORD = "a good long one"


@pytest.fixture
async def book(connector: Connector) -> AsyncIterator[AccountBook]:
    store = Store(connect=connector, linger_s=0)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(store.run())
        yield AccountBook(store, session_ttl_s=3600)
        task.cancel()


async def test_login_session_logout(book: AccountBook) -> None:
    await book.add("mama", ConsoleRole.PARENT, PASSWORD, (DeviceGrant("dev1", "小明"),))
    assert await book.count() == 1
    assert await book.login("mama", "wrong password") is None
    assert await book.login("nobody", PASSWORD) is None
    assert await book.login("BAD NAME", PASSWORD) is None
    found = await book.login("mama", PASSWORD)
    assert found is not None
    token, who = found
    assert who.user.role is ConsoleRole.PARENT
    assert who.user.may_see("dev1")
    assert not who.user.may_see("dev2")
    again = await book.session(token)
    assert again is not None
    assert again.csrf == who.csrf
    assert await book.session("x" * 200) is None
    assert await book.session("") is None
    await book.logout(token)
    assert await book.session(token) is None


async def test_operator_sees_all_and_duplicates_are_refused(book: AccountBook) -> None:
    await book.add("ops", ConsoleRole.OPERATOR, PASSWORD)
    await book.add("t", ConsoleRole.TEACHER, PASSWORD, (DeviceGrant("d2", "一班"),))
    with pytest.raises(AccountError, match="exists"):
        await book.add("ops", ConsoleRole.OPERATOR, PASSWORD)
    with pytest.raises(AccountError, match="password"):
        await book.add("short", ConsoleRole.OPERATOR, "short")
    found = await book.login("ops", PASSWORD)
    assert found is not None
    assert found[1].user.may_see("anything")
    assert await book.all_devices() == [DeviceGrant("d2", "一班")]


def test_grants_passwords_and_csrf() -> None:
    assert parse_grant("aa_bb=小明") == DeviceGrant("aa_bb", "小明")
    assert parse_grant("dev") == DeviceGrant("dev", "")
    for bad in ("", "a b", "dev=" + "x" * 65):
        with pytest.raises(AccountError):
            parse_grant(bad)
    assert not verify_password(None, PASSWORD)
    assert not verify_password("not a hash", PASSWORD)
    assert csrf_ok("abc", "abc")
    assert not csrf_ok("abc", "abd")
    assert not csrf_ok("abc", None)


def test_cli_add_passwd_remove(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SNLPGW_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("SNLPGW_MQTT__PASSWORD", "unused")

    def run(*argv: str, stdin: str = PASSWORD + "\n") -> int:
        monkeypatch.setattr("sys.stdin", __import__("io").StringIO(stdin))
        return main(["user", *argv])

    assert run("add", "mama", "--role", "parent", "--device", "dev1=小明", "--password-stdin") == 0
    assert "已添加用户 mama" in capsys.readouterr().out
    assert run("add", "mama", "--role", "parent", "--password-stdin") == 1
    assert run("add", "Bad Name", "--role", "parent", "--password-stdin") == 1
    assert run("add", "x", "--role", "parent", "--device", "bad dev", "--password-stdin") == 1
    assert run("passwd", "mama", "--password-stdin", stdin="another good one\n") == 0
    assert run("passwd", "nobody", "--password-stdin") == 1
    assert run("remove", "mama") == 0
    assert run("remove", "mama") == 1
    assert "没有用户 mama" in capsys.readouterr().err
