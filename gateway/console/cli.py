"""``snlpgw user add|passwd|remove``: console accounts, written straight into the store (the
gateway may be running: SQLite in WAL mode and PostgreSQL both take the second writer).

The password is asked twice on the terminal, or read from the first line of standard input
with ``--password-stdin`` (scripts). Messages are in English and Chinese. Exit status: 0 done,
1 refused (bad input, unknown or existing user), 2 the store could not be opened.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from gateway.cli.subcommands import Subparsers
from gateway.console.accounts import (
    AccountError,
    ConsoleRole,
    DeviceGrant,
    add_user_sql,
    check_name,
    hash_password,
    parse_grant,
    remove_user_sql,
    set_password_sql,
)
from gateway.settings import load_settings
from gateway.store.db import Database
from gateway.store.dialect import connector_for
from gateway.store.errors import StoreError


def add_user_commands(sub: Subparsers) -> None:
    user = sub.add_parser("user", help="console accounts (parents, teachers, operators)")
    actions = user.add_subparsers(dest="user_command", required=True)
    add = actions.add_parser("add", help="a new account")
    add.add_argument("name")
    add.add_argument("--role", required=True, choices=[r.value for r in ConsoleRole])
    add.add_argument(
        "--device",
        action="append",
        default=[],
        metavar="DEV[=LABEL]",
        help="a device this user may see (parent: a child's, LABEL its name; teacher: the "
        "class's); repeat for more",
    )
    add.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    add.set_defaults(func=_add)
    passwd = actions.add_parser("passwd", help="set a new password (ends the user's sessions)")
    passwd.add_argument("name")
    passwd.add_argument("--password-stdin", action="store_true")
    passwd.set_defaults(func=_passwd)
    remove = actions.add_parser("remove", help="delete an account and its sessions")
    remove.add_argument("name")
    remove.set_defaults(func=_remove)


def _password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        return sys.stdin.readline().rstrip("\n")
    first = getpass.getpass("password / 密码: ")
    if getpass.getpass("again / 再输一次: ") != first:
        raise AccountError("the passwords differ / 两次输入的密码不一致")
    return first


def _open(args: argparse.Namespace) -> Database:
    settings = load_settings(args.config)
    return Database.open(connector_for(settings.store.url, settings.sqlite_path))


def _say(message: str, *, error: bool = False) -> None:
    print(message, file=sys.stderr if error else sys.stdout)


def _change(
    db: Database,
    args: argparse.Namespace,
    action: str,
    pw_hash: str,
    grants: tuple[DeviceGrant, ...],
) -> str:
    name = args.name
    if action == "add":
        add_user_sql(db, name, ConsoleRole(args.role), pw_hash, grants)
        return f"user {name} added / 已添加用户 {name}"
    done = set_password_sql(db, name, pw_hash) if action == "passwd" else remove_user_sql(db, name)
    if not done:
        raise AccountError(f"no user {name} / 没有用户 {name}")
    if action == "passwd":
        return f"password of {name} changed / 已修改 {name} 的密码"
    return f"user {name} removed / 已删除用户 {name}"


def _run(args: argparse.Namespace, action: str) -> int:
    try:
        check_name(args.name)
        pw_hash = hash_password(_password(args)) if action != "remove" else ""
        grants: tuple[DeviceGrant, ...] = tuple(parse_grant(d) for d in getattr(args, "device", []))
        db = _open(args)
    except AccountError as exc:
        _say(f"snlpgw user: {exc}", error=True)
        return 1
    except StoreError as exc:
        _say(f"snlpgw user: store / 数据库: {exc}", error=True)
        return 2
    try:
        _say(_change(db, args, action, pw_hash, grants))
    except AccountError as exc:
        _say(f"snlpgw user: {exc}", error=True)
        return 1
    except StoreError as exc:
        _say(f"snlpgw user: store / 数据库: {exc}", error=True)
        return 2
    finally:
        db.close()
    return 0


def _add(args: argparse.Namespace) -> int:
    return _run(args, "add")


def _passwd(args: argparse.Namespace) -> int:
    return _run(args, "passwd")


def _remove(args: argparse.Namespace) -> int:
    return _run(args, "remove")
