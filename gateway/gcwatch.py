"""How long the garbage collector stops the event loop: every collection's pause, by
generation, as ``snlpgw_gc_pause_ms{stat}`` quantiles (Prometheus' ``python_gc_*`` counts
collections, not their time). A full (generation 2) collection walks every live object; with
thousands of lessons' state that is the one pause a timer can see."""

from __future__ import annotations

import gc
import time
from typing import Any

from gateway.metrics import Metrics


def freeze_startup_heap() -> int:
    """Collect once, then move every object alive now (imported modules, schemas, settings,
    the built components) to the collector's permanent generation, so a full collection no
    longer walks them (the service does it as it starts, ``ops.gc_freeze``). Returns the
    number of objects frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def set_thresholds(thresholds: tuple[int, int, int] | None) -> tuple[int, int, int]:
    """Apply the collector's thresholds (``ops.gc_thresholds``; ``None``: leave them) and
    return those in force.

    What sets off a full collection is the old generation's growth: objects that outlive a
    middle-generation collection move there, and once they reach a quarter of it the next one
    walks everything. With the interpreter's (700, 10, 10), a middle collection comes every
    ~2 s at 1,000 lessons, and each moved the ~6,000 objects alive at that moment into the old
    generation (census: the window and watchdog timers with their contexts, bound methods and
    arguments, and the current step's row — each alive for one clip or window, ~2 s). That
    set off a full collection (~50 ms) about every 20 s. With 100 young collections per middle
    one (~17 s apart at that load) they die first; 20-clip runs of 1,000 lessons had no full
    collection at all (bench/results/load/gc-ab.md)."""
    if thresholds is not None:
        gc.set_threshold(*thresholds)
    first, second, third = gc.get_threshold()
    return first, second, third


class GcWatch:
    def __init__(self, metrics: Metrics) -> None:
        self.pauses = metrics.quantiles("gc_pause_ms", "Garbage collector pauses, all generations")
        self.full = metrics.quantiles("gc_full_pause_ms", "Full (generation 2) collection pauses")
        self._started = 0.0

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause_ms = (time.perf_counter() - self._started) * 1000.0
        self.pauses.observe(pause_ms)
        if info.get("generation") == 2:
            self.full.observe(pause_ms)
