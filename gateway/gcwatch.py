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
