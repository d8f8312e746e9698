"""The admission line on a real loop: starts paced in arrival order, a device's later requests
kept right behind its waiting one, refusals, release and close.

Requests are submitted while the line's clock is held still (:class:`HeldClock`), so what is
handled at once does not depend on how fast the test runs; waiting then runs on the loop."""

from __future__ import annotations

import asyncio

from gateway.metrics import Metrics
from gateway.tasks.core import ControlAction, ControlRefusal, ControlReply, ControlRequest
from gateway.tasks.core.admission import AdmissionConfig
from gateway.tasks.starts import PER_DEVICE, StartLine, loop_ms

A = ControlAction


def request(action: ControlAction, rid: str) -> ControlRequest:
    return ControlRequest(action=action, request_id=rid, app_id="a", task_id="t", lesson_id="l")


class HeldClock:
    """The loop's clock in ms, or the moment it was held at."""

    def __init__(self) -> None:
        self.held: float | None = loop_ms()

    def __call__(self) -> float:
        return loop_ms() if self.held is None else self.held

    def release(self) -> None:
        self.held = None


class Recorded:
    def __init__(self) -> None:
        self.handled: list[tuple[str, str]] = []  # (device, request id), in handling order
        self.replies: list[tuple[str, ControlReply]] = []
        self.changed = asyncio.Event()
        self.doomed: set[str] = set()  # request ids the runtime would refuse
        self.failing: set[str] = set()  # devices whose handling raises

    def would_refuse(self, device: str, req: ControlRequest) -> bool:
        del device
        return req.request_id in self.doomed

    def handle(self, device: str, req: ControlRequest) -> None:
        if device in self.failing:
            raise RuntimeError("boom")
        self.handled.append((device, req.request_id))
        self.changed.set()

    def reply(self, device: str, reply: ControlReply) -> None:
        self.replies.append((device, reply))

    def refused(self) -> list[tuple[str, str, ControlRefusal | None]]:
        return [(d, r.request_id, r.reason) for d, r in self.replies if not r.accepted]

    async def until_handled(self, count: int) -> None:
        async with asyncio.timeout(10):
            while len(self.handled) < count:
                self.changed.clear()
                await self.changed.wait()


def line(rate: float, burst: int, wait_ms: float) -> tuple[StartLine, Recorded, Metrics, HeldClock]:
    rec, metrics, clock = Recorded(), Metrics(), HeldClock()
    starts = StartLine(
        AdmissionConfig(rate_per_s=rate, burst=burst, max_wait_ms=wait_ms),
        handle=rec.handle, reply=rec.reply, would_refuse=rec.would_refuse, metrics=metrics,
        clock=clock,
    )  # fmt: skip
    return starts, rec, metrics, clock


async def test_a_herd_of_starts_is_paced_in_arrival_order() -> None:
    starts, rec, metrics, clock = line(rate=200, burst=2, wait_ms=1_000)
    for i in range(6):
        starts.submit(f"d{i}", request(A.START, f"r{i}"))
    assert rec.handled == [("d0", "r0"), ("d1", "r1")]  # the burst, in the caller's turn
    assert metrics.snapshot()["snlpgw_runtime_admission_waiting"] == 4
    clock.release()
    await rec.until_handled(6)
    assert rec.handled == [(f"d{i}", f"r{i}") for i in range(6)]
    snap = metrics.snapshot()
    assert snap["snlpgw_runtime_admission_paced_total"] == 4
    assert snap["snlpgw_runtime_admission_waiting"] == 0
    assert snap['snlpgw_runtime_admission_wait_ms{stat="count"}'] == 4
    assert snap['snlpgw_runtime_admission_wait_ms{stat="max"}'] >= 20.0  # the 4th: 4 x 5 ms
    assert rec.replies == []


async def test_a_devices_later_requests_follow_its_waiting_one_and_others_do_not_wait() -> None:
    starts, rec, _, clock = line(rate=10, burst=1, wait_ms=1_000)
    starts.submit("a", request(A.START, "a-start"))  # the burst
    starts.submit("b", request(A.RESTART, "b-restart"))  # its slot: 100 ms on
    starts.submit("c", request(A.START, "c-start"))  # 200 ms on
    starts.submit("b", request(A.STOP, "b-stop"))  # right behind b-restart, not after c-start
    starts.submit("a", request(A.PAUSE, "a-pause"))  # nothing of a waits: at once
    assert rec.handled == [("a", "a-start"), ("a", "a-pause")]
    assert ("b" in starts, "a" in starts) == (True, False)
    clock.release()
    await rec.until_handled(4)
    assert rec.handled[2:] == [("b", "b-restart"), ("b", "b-stop")]
    starts.submit("b", request(A.PAUSE, "b-pause"))  # nothing of b waits any more: at once
    assert rec.handled[-1] == ("b", "b-pause")
    await rec.until_handled(6)
    assert rec.handled[-1] == ("c", "c-start")


async def test_a_start_past_the_longest_wait_is_refused_overloaded_at_once() -> None:
    starts, rec, metrics, clock = line(rate=10, burst=1, wait_ms=150)
    for i in range(4):
        starts.submit(f"d{i}", request(A.START, f"r{i}"))
    assert rec.handled == [("d0", "r0")]  # r1 waits 100 ms; r2 and r3 (200 ms) would not fit
    assert rec.refused() == [
        ("d2", "r2", ControlRefusal.OVERLOADED),
        ("d3", "r3", ControlRefusal.OVERLOADED),
    ]
    assert all(r.action == "start" and "admission" in (r.detail or "") for _, r in rec.replies)
    assert metrics.snapshot()["snlpgw_runtime_admission_refused_total"] == 2
    clock.release()
    await rec.until_handled(2)
    assert rec.handled == [("d0", "r0"), ("d1", "r1")]


async def test_a_request_the_runtime_refuses_anyway_takes_no_slot() -> None:
    starts, rec, metrics, clock = line(rate=10, burst=1, wait_ms=150)
    rec.doomed = {"offline-1", "offline-2"}
    starts.submit("d0", request(A.START, "r0"))  # the one slot of the burst
    starts.submit("d1", request(A.START, "offline-1"))  # refused by its runtime: at once
    starts.submit("d2", request(A.RESUME, "offline-2"))
    assert rec.handled == [("d0", "r0"), ("d1", "offline-1"), ("d2", "offline-2")]
    starts.submit("d3", request(A.START, "r3"))  # the next slot, 100 ms on
    assert rec.replies == []  # 300 ms on, past the 150 ms wait, had the others taken slots
    clock.release()
    await rec.until_handled(4)
    assert metrics.snapshot()["snlpgw_runtime_admission_paced_total"] == 1


async def test_one_device_holds_at_most_its_share_of_the_line() -> None:
    starts, rec, metrics, clock = line(rate=10, burst=1, wait_ms=10_000)
    starts.submit("d", request(A.START, "d-start"))  # the burst: at once
    starts.submit("hog", request(A.START, "hog-start"))  # waits 100 ms
    for i in range(PER_DEVICE + 1):  # stops behind it: PER_DEVICE - 1 fit, two do not
        starts.submit("hog", request(A.STOP, f"hog-stop-{i}"))
    starts.submit("other", request(A.START, "other-start"))  # its own slot: 200 ms on
    assert rec.refused() == [
        ("hog", f"hog-stop-{i}", ControlRefusal.OVERLOADED) for i in (PER_DEVICE - 1, PER_DEVICE)
    ]
    assert all("this device" in (r.detail or "") for _, r in rec.replies)
    assert metrics.snapshot()["snlpgw_runtime_admission_waiting"] == PER_DEVICE + 1
    clock.release()
    await rec.until_handled(PER_DEVICE + 2)
    assert rec.handled[-1] == ("other", "other-start")


async def test_a_released_devices_waiting_requests_are_refused_and_others_go_on() -> None:
    starts, rec, metrics, clock = line(rate=10, burst=1, wait_ms=1_000)
    starts.submit("d0", request(A.START, "r0"))
    starts.submit("moved", request(A.START, "moved-start"))  # waits 100 ms
    starts.submit("moved", request(A.STOP, "moved-stop"))
    starts.submit("d2", request(A.START, "r2"))  # waits 200 ms
    assert starts.devices() == ["moved", "d2"]
    starts.release("moved")
    starts.release("never-waited")  # nothing of it in the line: nothing to do
    assert rec.refused() == [
        ("moved", "moved-start", ControlRefusal.OVERLOADED),
        ("moved", "moved-stop", ControlRefusal.OVERLOADED),
    ]
    assert all("another gateway" in (r.detail or "") for _, r in rec.replies)
    assert "moved" not in starts
    clock.release()
    await rec.until_handled(2)
    assert rec.handled == [("d0", "r0"), ("d2", "r2")]
    assert metrics.snapshot()["snlpgw_runtime_admission_waiting"] == 0


async def test_a_request_whose_handling_raises_does_not_strand_the_ones_behind_it() -> None:
    starts, rec, _, clock = line(rate=100, burst=1, wait_ms=1_000)
    rec.failing = {"bad"}
    starts.submit("first", request(A.START, "r0"))
    starts.submit("bad", request(A.START, "r1"))
    starts.submit("bad", request(A.STOP, "r2"))
    starts.submit("good", request(A.START, "r3"))
    clock.release()
    await rec.until_handled(2)
    assert rec.handled == [("first", "r0"), ("good", "r3")]


async def test_nothing_waiting_is_handled_after_close() -> None:
    starts, rec, metrics, clock = line(rate=20, burst=1, wait_ms=1_000)
    starts.submit("d0", request(A.START, "r0"))
    starts.submit("d1", request(A.START, "r1"))
    starts.submit("d1", request(A.STOP, "r2"))
    starts.close()
    clock.release()
    assert metrics.snapshot()["snlpgw_runtime_admission_waiting"] == 0
    await asyncio.sleep(0.2)  # four times the paced start's 50 ms slot
    assert rec.handled == [("d0", "r0")]
    starts.submit("d1", request(A.STOP, "r3"))  # d1 no longer waits for anything
    assert rec.handled[-1] == ("d1", "r3")
