"""Who holds a local port: a bind test, and the owning process read from ``/proc`` (Linux).

Used by ``snlpgw dev-run`` to refuse a second start with "port 1883 is held by pid 4242
(mosquitto)" instead of a bind traceback, and by ``snlpgw doctor``. The owner is found by
matching the socket inode in ``/proc/net/{tcp,udp}[6]`` against ``/proc/*/fd``; processes of
other users are invisible to a non-root caller, so the owner may be unknown.
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Proto = Literal["tcp", "udp"]

_TCP_LISTEN = "0A"
_UDP_UNCONNECTED = "07"


@dataclass(frozen=True, slots=True)
class PortOwner:
    pid: int
    name: str

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.name})"


def port_free(host: str, port: int, proto: Proto) -> bool:
    """True when ``host:port`` can be bound now (SO_REUSEADDR, as servers bind)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    with socket.socket(family, kind) as sock:
        if proto == "tcp":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _inodes(port: int, proto: Proto, proc: Path) -> set[str]:
    state = _TCP_LISTEN if proto == "tcp" else _UDP_UNCONNECTED
    found: set[str] = set()
    for table in (proc / "net" / proto, proc / "net" / f"{proto}6"):
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != state:
                continue
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    found.discard("0")
    return found


def port_owner(port: int, proto: Proto, *, proc: Path = Path("/proc")) -> PortOwner | None:
    """The process holding a listening ``proto`` socket on ``port``, if visible to us."""
    inodes = _inodes(port, proto, proc)
    if not inodes:
        return None
    targets = {f"socket:[{inode}]" for inode in inodes}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in targets:
                        name = (entry / "comm").read_text().strip()
                        return PortOwner(int(entry.name), name)
    return None


def describe_holder(port: int, proto: Proto) -> str:
    owner = port_owner(port, proto)
    return str(owner) if owner else "another process (not visible to this user)"
