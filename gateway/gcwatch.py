"""How long the garbage collector stops the event loop: every collection's pause, by
generation, as ``snlpgw_gc_pause_ms{stat}`` quantiles (Prometheus' ``python_gc_*`` counts
collections, not their time). A full (generation 2) collection walks every live object; with
thousands of lessons' state that is the one pause a timer can see."""

from __future__ import annotations

import gc
import sys
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


INCREMENTAL = sys.version_info >= (3, 14)  # 3.14's collector reads its thresholds otherwise


def set_thresholds(
    thresholds: tuple[int, int, int] | None, *, incremental: bool = INCREMENTAL
) -> tuple[int, int, int] | None:
    """Apply the collector's thresholds (``ops.gc_thresholds``; ``None``: leave those in force)
    and return those in force; ``None`` when thresholds were asked for on an interpreter whose
    collector is incremental, which are then not applied (3.14+: the third threshold is ignored
    and the second paces the old generation's scan, which these values were not measured for).

    A full collection walks every tracked object (44-74 ms at 1,000 lessons). The interpreter
    runs one after every 11th middle-generation collection once what those moved into the old
    generation reaches a quarter of it. With its (700, 10, 10), a middle collection came every
    ~3 s at 1,000 lessons and moved the ~6,000 young objects alive at that instant (census:
    each lesson's window or watchdog timer with its context, bound method and arguments, and
    the current step row, each alive ~2 s), so full collections came ~35 s apart. With 100
    young collections per middle one, middle collections are ~17 s apart at that load: a tenth
    as many objects reach the old generation, and full collections are ~190 s apart or more
    (bench/results/load/gc-ab.md). The cost: cyclic garbage that reached the old generation
    waits that much longer to be freed."""
    if thresholds is not None:
        if incremental:
            return None
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
