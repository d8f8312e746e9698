"""Process accounting from /proc (Linux): CPU seconds and RSS of one process, machine load.

No psutil: ``/proc/<pid>/stat`` fields 14-15 (utime, stime, clock ticks) and ``/proc/<pid>/status``
``VmRSS`` are all the harness needs, for the gateway, the broker and its own worker processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypedDict

from devstack.process import die_with_parent as die_with_parent  # noqa: PLC0414 - the workers' import

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (all its threads)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "
    return (int(fields[11]) + int(fields[12])) / _TICK


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot, from the first line of /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])
    return float(total - idle), float(total)


def cpu_jiffies() -> dict[int, tuple[int, int, int]]:
    """Per CPU: (busy, steal, total) jiffies since boot, from the ``cpuN`` lines of /proc/stat;
    busy is user + nice + system + irq + softirq (steal, the hypervisor running someone else
    on this vCPU, apart)."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3].isdigit():
            name, *fields = line.split()
            v = [int(x) for x in fields[:8]]
            out[int(name[3:])] = (v[0] + v[1] + v[2] + v[5] + v[6], v[7], sum(v))
    return out


class CpuSample(NamedTuple):
    at_ms: float  # monotonic, at the end of the interval
    process: float  # the sampled process's CPU over the interval, in cores
    busy: dict[int, float]  # each CPU's busy share (steal excluded)
    steal: float  # steal share, mean over the CPUs


async def sample_cpus(pid: int, out: list[CpuSample], period_s: float = 0.1) -> None:
    """Until cancelled: a :class:`CpuSample` every ``period_s`` (/proc counts 10 ms ticks, so
    a share is ±0.1 at 100 ms)."""
    before, own, wall = cpu_jiffies(), cpu_s(pid), time.monotonic()
    while True:
        await asyncio.sleep(period_s)
        now, own_now, wall_now = cpu_jiffies(), cpu_s(pid), time.monotonic()
        busy, steal = {}, []
        for cpu, (b, st, total) in now.items():
            b0, st0, total0 = before.get(cpu, (b, st, total))
            span = total - total0
            busy[cpu] = (b - b0) / span if span > 0 else 0.0
            steal.append((st - st0) / span if span > 0 else 0.0)
        process = (own_now - own) / (wall_now - wall) if wall_now > wall else 0.0
        out.append(CpuSample(wall_now * 1000, process, busy, sum(steal) / max(1, len(steal))))
        before, own, wall = now, own_now, wall_now


@dataclass
class Meter:
    """CPU used by a set of processes and by the whole machine between start and stop."""

    pids: dict[str, int]
    wall0: float = 0.0
    cpu0: dict[str, float] | None = None
    busy0: tuple[float, float] = (0.0, 0.0)

    def start(self) -> None:
        self.wall0 = time.monotonic()
        self.cpu0 = {name: cpu_s(pid) for name, pid in self.pids.items()}
        self.busy0 = machine_busy()

    def stop(self, reported: dict[str, float] | None = None) -> dict[str, float]:
        """Per process: CPU seconds and share of one core; machine: busy share of all cores,
        and the share used by processes outside this set (the other engineers' load).
        ``reported``: CPU seconds of processes that measured themselves (already exited)."""
        assert self.cpu0 is not None, "start() first"
        wall = time.monotonic() - self.wall0
        busy, total = machine_busy()
        out: dict[str, float] = {"wall_s": round(wall, 3)}
        ours = 0.0
        used_by = {name: cpu_s(pid) - self.cpu0[name] for name, pid in self.pids.items()}
        for name, used in (used_by | (reported or {})).items():
            ours += used
            out[f"{name}_cpu_s"] = round(used, 3)
            out[f"{name}_core_share"] = round(used / wall, 3) if wall else 0.0
        cores = os.cpu_count() or 1
        d_busy, d_total = busy - self.busy0[0], total - self.busy0[1]
        machine = d_busy / d_total if d_total else 0.0
        out["machine_busy_share"] = round(machine, 3)
        out["others_core_share"] = round(max(0.0, machine * cores - ours / wall), 3)
        return out


def hold_gc() -> None:
    """For a worker about to measure: its own garbage collector must not stop its loop while it
    does. A full collection in a worker simulating 500 boards stopped it for up to ~300 ms,
    read as gateway latency (1,000 lessons of 20 clips: p99 spikes at the same seconds in every
    run, gone with this). What setup built is frozen and automatic collection stays off until
    the worker exits: it lives for one run."""
    gc.collect()
    gc.freeze()
    gc.disable()


class Placement(TypedDict):
    """Where a run's processes ran: CPU numbers, or ``"shared"`` when nothing was moved."""

    gateway_cpus: list[int] | str
    others_cpus: list[int] | str


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus``. A thread started while this runs inherits the mask
    of the thread that started it, so it goes again until no thread is new."""
    done: set[str] = set()
    while todo := set(os.listdir(f"/proc/{pid}/task")) - done:
        for tid in todo:
            with contextlib.suppress(ProcessLookupError):  # a thread that just ended
                os.sched_setaffinity(int(tid), cpus)
        done |= todo


def descendants(pid: int) -> list[int]:
    """``pid``'s child processes, theirs and so on (a server and the backends it forked)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        with contextlib.suppress(FileNotFoundError):  # a process that just ended
            for task in Path(f"/proc/{parent}/task").iterdir():
                children = [int(x) for x in (task / "children").read_text().split()]
                found.extend(children)
                todo.extend(children)
    return found


def place_gateway(gateway: int, rest: Iterable[int], *, on: bool = True) -> Placement:
    """The gateway's process on a CPU of its own and the run's other processes (broker, board
    and device workers, a profiler) on the others; returns the placement for the report.

    The targets are per gateway core. On a 2-CPU machine, unplaced, the scheduler ran the
    harness's own workers and the broker (~0.7 of a core at 1,000 lessons) on the gateway's CPU
    at times, and their turns showed as gateway latency (20-clip runs of 1,000 lessons
    alternating in the same minutes: next-clip p99 34-104 ms unplaced, 22-35 ms placed, at the
    same gateway CPU per step; bench/results/load/placement-ab.md). The harness itself goes
    with the others while a lessons run measures (:func:`harness_on`). Off (``on=False``) or
    with one CPU, nothing moves. The processes placed end with their run."""
    return place_gateways([gateway], rest, on=on)


def place_gateways(gateways: list[int], rest: Iterable[int], *, on: bool = True) -> Placement:
    """:func:`place_gateway` for a cluster's gateway processes: each on a CPU of its own (the
    last ones), the rest on what is left; shared (nothing moved) unless the machine has a CPU
    more than there are gateways."""
    plan = cpu_plan(sorted(os.sched_getaffinity(0)), len(gateways)) if on else None
    if plan is None:
        return {"gateway_cpus": "shared", "others_cpus": "shared"}
    own, others = plan
    for gateway, cpu in zip(gateways, own, strict=True):
        _pin(gateway, {cpu})
    for pid in rest:
        _pin(pid, set(others))
    return {"gateway_cpus": own, "others_cpus": others}


def cpu_plan(cpus: list[int], gateways: int) -> tuple[list[int], list[int]] | None:
    """Each gateway's CPU (the highest first: CPU 0 takes most interrupts) and the CPUs left
    for the rest, or None when no CPU would be left."""
    if len(cpus) <= gateways:
        return None
    ordered = sorted(cpus)
    return ordered[::-1][:gateways], ordered[: len(ordered) - gateways]


@contextlib.contextmanager
def harness_on(placement: Placement) -> Iterator[None]:
    """The harness's own process on the others' CPUs while a placed run measures (its broker
    probe and samplers are not idle), back where it was afterwards (later phases place again
    from what the harness may use)."""
    cpus = placement["others_cpus"]
    if not isinstance(cpus, list):
        yield
        return
    before = os.sched_getaffinity(0)
    _pin(os.getpid(), set(cpus))
    try:
        yield
    finally:
        _pin(os.getpid(), before)


def load_conditions() -> dict[str, object]:
    """What else the machine was doing when a run started (it is shared)."""
    busy0 = machine_busy()
    time.sleep(1.0)
    busy1 = machine_busy()
    share = (busy1[0] - busy0[0]) / max(1.0, busy1[1] - busy0[1])
    return {
        "cpus": os.cpu_count(),
        "loadavg_1_5_15": [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]],
        "busy_share_before_run": round(share, 3),
    }
