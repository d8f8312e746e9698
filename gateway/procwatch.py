"""What the process that started ``snlpgw dev-run`` is doing, read from ``/proc`` (Linux).

GNU make, sent SIGINT or SIGHUP on its own, does not pass it on to its recipe: its handler
waits for the recipe to end. While it waits there, the signal is in make's blocked mask
(``SigBlk`` in ``/proc/PID/status``); ``dev-run`` reads that as "make was told to stop".
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

MAKE_NAMES = {"make", "gmake"}
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def make_ancestor() -> int | None:
    """The make that started us (parent, or grandparent through ``sh -c``), if any."""
    pid = os.getppid()
    for _ in range(3):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return None
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if fields.get("Name", "").strip() in MAKE_NAMES:
            return pid
        pid = int(fields.get("PPid", "0"))
        if pid <= 1:
            return None
    return None


def fatal_signal_in_handler(pid: int) -> signal.Signals | None:
    """A stop signal ``pid`` has blocked (as while it runs that signal's handler), if any."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("SigBlk:"):
            mask = int(line.split()[1], 16)
            for sig in STOP_SIGNALS:
                if mask & (1 << (sig - 1)):
                    return sig
    return None
