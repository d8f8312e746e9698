"""Console accounts, device grants and server-side sessions, in the store (migration 0004).

* Passwords: argon2id (argon2-cffi's defaults, RFC 9106 low-memory profile), hashed and verified
  on a worker thread (``asyncio.to_thread``), never on the loop nor on the store's thread. An
  unknown user name is verified against a dummy hash, so the answer takes as long either way.
* Sessions: a random token (256 bits) in the cookie; the store keeps only its SHA-256, the
  user, a per-session CSRF token and the expiry. Logging out or removing the user deletes them.
* Grants: a parent's children (one device each, labelled with the child's name) or a teacher's
  class; an operator sees every device and needs none.

The synchronous functions (``*_sql``) run on the store's thread through :meth:`Store.call`;
the CLI runs them on a :class:`~gateway.store.db.Database` it opens itself.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from gateway.store.db import Database
from gateway.store.store import Store

NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
DEVICE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
MIN_PASSWORD = 8
MAX_PASSWORD = 1024
MAX_LABEL = 64

_hasher = PasswordHasher()
_DUMMY_HASH = _hasher.hash(secrets.token_hex(16))


class ConsoleRole(enum.StrEnum):
    PARENT = "parent"
    TEACHER = "teacher"
    OPERATOR = "operator"


@dataclass(frozen=True, slots=True)
class DeviceGrant:
    device: str
    label: str  # the child's name (parent) or the class (teacher); may be empty


@dataclass(frozen=True, slots=True)
class ConsoleUser:
    name: str
    role: ConsoleRole
    grants: tuple[DeviceGrant, ...] = ()

    def may_see(self, device: str) -> bool:
        return self.role is ConsoleRole.OPERATOR or any(g.device == device for g in self.grants)


@dataclass(frozen=True, slots=True)
class LoggedIn:
    user: ConsoleUser
    csrf: str


class AccountError(ValueError):
    """Bad input to an account change (a clear message for the CLI)."""


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise AccountError("user name: 1-64 of a-z 0-9 _ . - (starting with a letter or digit)")
    return name


def check_password(password: str) -> str:
    if not MIN_PASSWORD <= len(password) <= MAX_PASSWORD:
        raise AccountError(f"password: {MIN_PASSWORD}-{MAX_PASSWORD} characters")
    return password


def parse_grant(text: str) -> DeviceGrant:
    """``DEVICE`` or ``DEVICE=LABEL`` (the CLI's ``--device``)."""
    device, _, label = text.partition("=")
    if not DEVICE_RE.fullmatch(device):
        raise AccountError(f"device {device!r}: 1-128 of A-Z a-z 0-9 _ . : -")
    if len(label) > MAX_LABEL:
        raise AccountError(f"label: at most {MAX_LABEL} characters")
    return DeviceGrant(device, label)


def hash_password(password: str) -> str:
    return _hasher.hash(check_password(password))


def verify_password(stored: str | None, password: str) -> bool:
    """Constant work whether or not the user exists (``stored`` None: the dummy hash)."""
    try:
        return _hasher.verify(stored or _DUMMY_HASH, password[:MAX_PASSWORD]) and bool(stored)
    except (VerificationError, InvalidHashError):
        return False


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# ---- on the store's thread -------------------------------------------------------------------


def count_users_sql(db: Database) -> int:
    return int(str(db.query("SELECT COUNT(*) FROM console_users")[0][0]))


def add_user_sql(
    db: Database, name: str, role: ConsoleRole, pw_hash: str, grants: tuple[DeviceGrant, ...]
) -> None:
    if db.query("SELECT 1 FROM console_users WHERE name = ?", (name,)):
        raise AccountError(f"user {name} exists (use passwd, or remove it first)")
    statements: list[tuple[str, tuple[object, ...]]] = [
        (
            "INSERT INTO console_users (name, role, password_hash, created_ms) VALUES (?, ?, ?, ?)",
            (name, role.value, pw_hash, now_ms()),
        )
    ]
    statements += [
        (
            "INSERT INTO console_grants (name, device, label) VALUES (?, ?, ?)",
            (name, g.device, g.label),
        )
        for g in {g.device: g for g in grants}.values()
    ]
    db.change(statements)


def set_password_sql(db: Database, name: str, pw_hash: str) -> bool:
    """Also ends the user's sessions (a changed password logs everyone out)."""
    changed = db.change(
        [
            ("DELETE FROM console_sessions WHERE name = ?", (name,)),
            ("UPDATE console_users SET password_hash = ? WHERE name = ?", (pw_hash, name)),
        ]
    )
    return changed > 0


def remove_user_sql(db: Database, name: str) -> bool:
    """Explicit deletes: SQLite enforces no foreign keys unless asked to."""
    changed = db.change(
        [
            ("DELETE FROM console_sessions WHERE name = ?", (name,)),
            ("DELETE FROM console_grants WHERE name = ?", (name,)),
            ("DELETE FROM console_users WHERE name = ?", (name,)),
        ]
    )
    return changed > 0


def password_hash_sql(db: Database, name: str) -> str | None:
    rows = db.query("SELECT password_hash FROM console_users WHERE name = ?", (name,))
    return str(rows[0][0]) if rows else None


def load_user_sql(db: Database, name: str) -> ConsoleUser | None:
    rows = db.query("SELECT role FROM console_users WHERE name = ?", (name,))
    if not rows:
        return None
    grants = db.query(
        "SELECT device, label FROM console_grants WHERE name = ? ORDER BY label, device", (name,)
    )
    return ConsoleUser(
        name,
        ConsoleRole(str(rows[0][0])),
        tuple(DeviceGrant(str(d), str(lbl)) for d, lbl in grants),
    )


def all_grants_sql(db: Database) -> list[DeviceGrant]:
    """Every device someone was given, once (the operator's device list)."""
    rows = db.query("SELECT device, MIN(label) FROM console_grants GROUP BY device ORDER BY device")
    return [DeviceGrant(str(d), str(lbl or "")) for d, lbl in rows]


def create_session_sql(
    db: Database, name: str, *, token: str, csrf: str, now: int, ttl_ms: int
) -> None:
    db.change(
        [
            ("DELETE FROM console_sessions WHERE expires_ms <= ?", (now,)),
            (
                "INSERT INTO console_sessions (token_hash, name, csrf, created_ms, expires_ms) "
                "VALUES (?, ?, ?, ?, ?)",
                (token_hash(token), name, csrf, now, now + ttl_ms),
            ),
        ]
    )


def session_sql(db: Database, token: str, now: int) -> LoggedIn | None:
    rows = db.query(
        "SELECT name, csrf FROM console_sessions WHERE token_hash = ? AND expires_ms > ?",
        (token_hash(token), now),
    )
    if not rows:
        return None
    user = load_user_sql(db, str(rows[0][0]))
    return None if user is None else LoggedIn(user, str(rows[0][1]))


def end_session_sql(db: Database, token: str) -> None:
    db.change([("DELETE FROM console_sessions WHERE token_hash = ?", (token_hash(token),))])


# ---- async, for the web shell ----------------------------------------------------------------


class AccountBook:
    """The console's accounts over the shared store."""

    def __init__(self, store: Store, *, session_ttl_s: float) -> None:
        self._store = store
        self._ttl_ms = int(session_ttl_s * 1000)

    async def count(self) -> int:
        return await self._store.call(count_users_sql)

    async def add(
        self, name: str, role: ConsoleRole, password: str, grants: tuple[DeviceGrant, ...] = ()
    ) -> None:
        pw_hash = await asyncio.to_thread(hash_password, password)
        await self._store.call(lambda db: add_user_sql(db, check_name(name), role, pw_hash, grants))

    async def login(self, name: str, password: str) -> tuple[str, LoggedIn] | None:
        """A new session's (token, who) when the password is right; None otherwise."""
        stored = None
        if NAME_RE.fullmatch(name):
            stored = await self._store.call(lambda db: password_hash_sql(db, name))
        if not await asyncio.to_thread(verify_password, stored, password):
            return None
        user = await self._store.call(lambda db: load_user_sql(db, name))
        if user is None:
            return None
        token, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
        now = now_ms()
        await self._store.call(
            lambda db: create_session_sql(
                db, name, token=token, csrf=csrf, now=now, ttl_ms=self._ttl_ms
            )
        )
        return token, LoggedIn(user, csrf)

    async def session(self, token: str) -> LoggedIn | None:
        if not token or len(token) > 128:
            return None
        now = now_ms()
        return await self._store.call(lambda db: session_sql(db, token, now))

    async def logout(self, token: str) -> None:
        await self._store.call(lambda db: end_session_sql(db, token))

    async def all_devices(self) -> list[DeviceGrant]:
        return await self._store.call(all_grants_sql)


def csrf_ok(expected: str, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest(expected.encode(), (given or "").encode())
