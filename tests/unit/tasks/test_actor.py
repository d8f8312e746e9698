"""The device actor as loop callbacks: when events are handled, its timer, containment, close.

The runtime here is a scripted stand-in (the actor's only collaborator it drives); the real
runtime's lessons through the actor are in test_task_service.py.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from gateway.metrics import Metrics
from gateway.tasks.actor import INBOX_LIMIT, DeviceActor
from gateway.tasks.actor_parts import ActorMetrics, Ports
from gateway.tasks.core import (
    ButtonPress,
    CommandOutcome,
    DeliveryResult,
    DeviceRuntime,
    RuntimeEvent,
    TimerFired,
    outcome_matters,
)

DEV = "aa_bb_cc_dd_ee_01"


class ScriptedRuntime:
    """Records (event, now) and keeps the deadline the test sets; ``boom`` events raise."""

    instance = None

    def __init__(self) -> None:
        self.seen: list[tuple[RuntimeEvent, float]] = []
        self.deadline: float | None = None
        self.fired = asyncio.Event()

    def handle(self, event: RuntimeEvent, now: float) -> list[Any]:
        self.seen.append((event, now))
        if isinstance(event, ButtonPress) and event.kind == "boom":
            raise RuntimeError("a bug in one event")
        if isinstance(event, TimerFired):
            self.fired.set()
            if self.deadline is not None and now >= self.deadline:
                self.deadline = None
        return []

    def next_deadline(self) -> float | None:
        return self.deadline

    def kinds(self) -> list[str]:
        return [getattr(e, "kind", type(e).__name__) for e, _ in self.seen]


def actor() -> tuple[DeviceActor, ScriptedRuntime, Metrics]:
    runtime = ScriptedRuntime()
    metrics = Metrics()
    ports = cast(Ports, None)  # no effects are produced: the ports are never reached
    a = DeviceActor(DEV, cast(DeviceRuntime, runtime), ports=ports, metrics=ActorMetrics(metrics))
    return a, runtime, metrics


async def test_deliver_handles_now_and_post_in_the_next_turn() -> None:
    a, runtime, _ = actor()
    a.post(ButtonPress("first"))
    assert runtime.kinds() == []  # queued for the next turn
    a.deliver(ButtonPress("second"))  # now, after what was queued before it
    assert runtime.kinds() == ["first", "second"]
    await asyncio.sleep(0)
    assert runtime.kinds() == ["first", "second"]  # the scheduled drain found nothing left


async def test_the_timer_fires_at_the_runtimes_deadline_and_is_rearmed() -> None:
    a, runtime, _ = actor()
    loop = asyncio.get_running_loop()
    armed = runtime.deadline = loop.time() * 1000.0 + 20
    a.deliver(ButtonPress("arm"))
    async with asyncio.timeout(5):
        await runtime.fired.wait()
    fired_at = runtime.seen[-1][1]
    # not before the deadline the runtime asked for (measured from the deadline itself, not
    # from when the event was handled: a busy loop may handle it late, never fire early);
    # 1 µs for asyncio's clock resolution and the ms <-> s float round trip
    assert fired_at >= armed - 0.001
    runtime.deadline = loop.time() * 1000.0 + 10_000  # a later one: the timer follows it
    a.deliver(ButtonPress("later"))
    assert a._timer is not None
    assert a._timer.when() * 1000.0 == runtime.deadline
    a.close()


async def test_an_event_that_raises_is_counted_and_the_next_one_still_handled() -> None:
    a, runtime, metrics = actor()
    a.deliver(ButtonPress("boom"))
    a.deliver(ButtonPress("after"))
    assert runtime.kinds() == ["boom", "after"]
    assert metrics.snapshot()["snlpgw_runtime_event_failures_total"] == 1.0


async def test_close_cancels_the_timer_and_refuses_events() -> None:
    a, runtime, _ = actor()
    runtime.deadline = asyncio.get_running_loop().time() * 1000.0 + 10
    a.deliver(ButtonPress("arm"))
    a.close()
    assert not a.deliver(ButtonPress("late"))
    await asyncio.sleep(0.05)
    assert runtime.kinds() == ["arm"]  # no TimerFired after close


async def test_a_full_inbox_drops_the_new_event_counted() -> None:
    a, runtime, metrics = actor()
    for i in range(INBOX_LIMIT):
        assert a.post(ButtonPress(str(i)))
    assert not a.post(ButtonPress("one too many"))
    assert metrics.snapshot()["snlpgw_runtime_inbox_dropped_total"] == 1.0
    await asyncio.sleep(0)
    assert len(runtime.seen) == INBOX_LIMIT


async def test_only_an_outcome_that_can_change_the_runtime_reaches_it() -> None:
    a, runtime, _ = actor()
    a._on_outcome("c1", DeliveryResult.ACKED)  # changes nothing: no turn for it
    a._on_outcome("c2", DeliveryResult.EXPIRED)
    await asyncio.sleep(0)
    assert [e for e, _ in runtime.seen] == [CommandOutcome("c2", DeliveryResult.EXPIRED)]
    assert [r for r in DeliveryResult if outcome_matters(r)] == [
        DeliveryResult.EXPIRED,
        DeliveryResult.FAILED,
        DeliveryResult.REJECTED,
    ]
