"""File primitives and broker reload hooks for :mod:`gateway.broker.credentials`.

* :func:`locked` — an exclusive ``flock`` on a lock file: serializes writers across threads
  (each call opens its own descriptor) and processes (the CLI racing the gateway).
* :func:`write_atomic` — tmp file + fsync + rename, with the mode set before the rename.
* Reloaders — :func:`pid_file_reloader` (SIGHUP to a local broker) and
  :func:`command_reloader` (e.g. ``docker exec <broker> kill -HUP 1``); :func:`reloader_for`
  picks one.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shlex
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)

Reloader = Callable[[], None]


def pid_file_reloader(pid_file: Path) -> Reloader:
    """SIGHUP the local broker named by its pid file; a no-op when no broker runs."""

    def reload() -> None:
        try:
            pid = int(pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            log.info("no broker pid in %s; broker files written, no reload sent", pid_file)
            return
        comm = Path(f"/proc/{pid}/comm")
        if comm.parent.parent.exists() and not _is_mosquitto(comm):
            log.warning("pid %d from %s is not mosquitto; no reload sent", pid, pid_file)
            return
        try:
            os.kill(pid, signal.SIGHUP)
        except ProcessLookupError:
            log.warning("stale broker pid file %s (pid %d); no reload sent", pid_file, pid)

    return reload


def command_reloader(argv: list[str], *, timeout_s: float = 10.0) -> Reloader:
    """Reload by running a command (no shell), e.g. ``docker exec <broker> kill -HUP 1``."""

    def reload() -> None:
        done = subprocess.run(argv, capture_output=True, timeout=timeout_s, check=False)  # noqa: S603 - operator argv, no shell
        if done.returncode != 0:
            raise RuntimeError(f"broker reload command exited {done.returncode}: {argv[0]}")

    return reload


def reloader_for(command: str | None, pid_file: Path) -> Reloader:
    """``command`` (one shell-like string, run without a shell) when given, else SIGHUP by pid file."""
    if command is None:
        return pid_file_reloader(pid_file)
    return command_reloader(shlex.split(command))


def _is_mosquitto(comm: Path) -> bool:
    try:
        return comm.read_text().strip() == "mosquitto"
    except OSError:
        return False


@contextlib.contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_atomic(path: Path, text: str, *, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)  # umask may have narrowed it; never widened
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
