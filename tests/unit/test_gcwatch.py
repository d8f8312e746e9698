"""The garbage collector's pauses as metrics, and the start-up heap frozen out of them."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gateway.gcwatch import GcWatch, freeze_startup_heap, set_thresholds
from gateway.metrics import Metrics


@pytest.fixture
def watch() -> Iterator[tuple[GcWatch, Metrics]]:
    metrics = Metrics()
    w = GcWatch(metrics)
    gc.disable()  # only the collections the test asks for
    w.install()
    try:
        yield w, metrics
    finally:
        w.uninstall()
        gc.enable()


def test_every_collection_is_timed_and_full_ones_apart(watch: tuple[GcWatch, Metrics]) -> None:
    _, metrics = watch
    gc.collect(0)
    gc.collect(2)
    snap = metrics.snapshot()
    assert snap['snlpgw_gc_pause_ms{stat="count"}'] == 2.0
    assert snap['snlpgw_gc_full_pause_ms{stat="count"}'] == 1.0
    assert snap['snlpgw_gc_full_pause_ms{stat="max"}'] >= 0.0


def test_install_is_idempotent_and_uninstall_stops_the_timing(
    watch: tuple[GcWatch, Metrics],
) -> None:
    w, metrics = watch
    w.install()  # twice: still one callback
    gc.collect(0)
    w.uninstall()
    gc.collect(0)
    assert metrics.snapshot()['snlpgw_gc_pause_ms{stat="count"}'] == 1.0


def test_the_startup_heap_is_frozen() -> None:
    try:
        frozen = freeze_startup_heap()
        assert frozen == gc.get_freeze_count() > 10_000  # modules, classes, ... of this process
    finally:
        gc.unfreeze()


def test_thresholds_are_set_or_left_alone() -> None:
    before = gc.get_threshold()
    try:
        assert set_thresholds(None) == before
        assert set_thresholds((900, 100, 12)) == gc.get_threshold() == (900, 100, 12)
        assert set_thresholds(None) == (900, 100, 12)
        # 3.14+: thresholds mean something else; nothing is touched
        assert set_thresholds((700, 100, 10), incremental=True) is None
        assert gc.get_threshold() == (900, 100, 12)
        assert set_thresholds(None, incremental=True) == (900, 100, 12)  # nothing asked
    finally:
        gc.set_threshold(*before)
