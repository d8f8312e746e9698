"""A real PostgreSQL for tests: ``initdb`` into a temporary directory, ``postgres`` on a free
port on 127.0.0.1 (TCP only), trust authentication, durability off (test data only).

PostgreSQL refuses to run as root: when the tests run as root the cluster belongs to the
``postgres`` system user (the Debian package creates it) and the server runs under ``runuser``.
Ready means a real connection succeeded, never after a sleep. No PostgreSQL binaries → a clear
failure naming the package (``make setup`` installs it), never a skip.

Used through the ``postgres`` fixture (session) in ``tests/conftest.py``; each test gets a
database of its own from :meth:`Postgres.new_database`.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg

from devstack.broker import free_port

READY_TIMEOUT_S = 30.0
SUPERUSER = "snlp"


class PostgresUnavailableError(RuntimeError):
    pass


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if found:
        return Path(found[0]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise PostgresUnavailableError("no initdb: install the Debian package `postgresql`")


def _as_owner(argv: list[str]) -> tuple[list[str], int | None]:
    """``argv`` run as the ``postgres`` user when we are root (and that user's uid)."""
    if os.geteuid() != 0:
        return argv, None
    try:
        uid = pwd.getpwnam("postgres").pw_uid
    except KeyError:
        raise PostgresUnavailableError(
            "running as root and no `postgres` user (install the package `postgresql`)"
        ) from None
    return ["runuser", "-u", "postgres", "--", *argv], uid


@dataclass
class Postgres:
    root: Path
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def admin_url(self) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh empty database; returns its URL."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # smart shutdown
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def start_postgres() -> Postgres:
    bindir = _bindir()
    # Not under pytest's tmp dir: its parents are 0700 root, which the postgres user cannot
    # traverse.
    root = Path(tempfile.mkdtemp(prefix="snlp-pg-"))
    data = root / "data"
    _, uid = _as_owner([])
    if uid is not None:
        os.chown(root, uid, -1)
    init, _ = _as_owner(
        [
            *(str(bindir / "initdb"), "-D", str(data), "-U", SUPERUSER, "--auth=trust"),
            *("-E", "UTF8", "--no-sync", "--no-instructions"),
        ]
    )
    done = subprocess.run(init, capture_output=True, check=False)
    if done.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise PostgresUnavailableError(f"initdb failed: {done.stderr.decode()[-2000:]}")
    port = free_port()
    argv, _ = _as_owner(
        [
            *(str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-h", "127.0.0.1"),
            *("-k", str(root), "-c", "fsync=off", "-c", "synchronous_commit=off"),
            *("-c", "full_page_writes=off", "-c", "max_connections=200"),
        ]
    )
    log = (root / "postgres.log").open("ab")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    log.close()
    running = Postgres(root, port, proc)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            text = (root / "postgres.log").read_text(errors="replace")[-2000:]
            shutil.rmtree(root, ignore_errors=True)
            raise PostgresUnavailableError(f"postgres exited ({proc.returncode}): {text}")
        with contextlib.suppress(psycopg.OperationalError):
            psycopg.connect(running.admin_url, connect_timeout=2).close()
            return running
        if time.monotonic() > deadline:
            running.stop()
            raise PostgresUnavailableError("postgres did not accept connections in time")
        time.sleep(0.1)  # polling a server that is starting up: it has no event to wait on
