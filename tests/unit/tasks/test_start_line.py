"""The admission line on a real loop: starts paced in arrival order, a device's later requests
kept behind its waiting start, refusal past the wait, nothing handled after close."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.metrics import Metrics
from gateway.tasks.core import ControlAction, ControlRefusal, ControlReply, ControlRequest
from gateway.tasks.core.admission import AdmissionConfig
from gateway.tasks.starts import PER_DEVICE, StartLine


def request(action: ControlAction, rid: str) -> ControlRequest:
    return ControlRequest(action=action, request_id=rid, app_id="a", task_id="t", lesson_id="l")


class Recorded:
    def __init__(self) -> None:
        self.handled: list[tuple[str, str]] = []  # (device, request id), in handling order
        self.replies: list[tuple[str, ControlReply]] = []
        self.changed = asyncio.Event()
        self.doomed: set[str] = set()  # request ids the runtime would refuse

    def would_refuse(self, device: str, req: ControlRequest) -> bool:
        del device
        return req.request_id in self.doomed

    def run(self, device: str, what: str) -> Callable[[], None]:
        """An input that is not a control request (a restore, a board event), recorded so."""
        return lambda: self.handle(device, request(ControlAction.STOP, what))

    def handle(self, device: str, req: ControlRequest) -> None:
        self.handled.append((device, req.request_id))
        self.changed.set()

    def reply(self, device: str, reply: ControlReply) -> None:
        self.replies.append((device, reply))

    async def until_handled(self, count: int) -> None:
        async with asyncio.timeout(10):
            while len(self.handled) < count:
                self.changed.clear()
                await self.changed.wait()


def line(rate: float, burst: int, wait_ms: float) -> tuple[StartLine, Recorded, Metrics]:
    rec, metrics = Recorded(), Metrics()
    config = AdmissionConfig(rate_per_s=rate, burst=burst, max_wait_ms=wait_ms)
    starts = StartLine(
        config, handle=rec.handle, reply=rec.reply, would_refuse=rec.would_refuse, metrics=metrics
    )
    return starts, rec, metrics


async def test_a_herd_of_starts_is_paced_in_arrival_order() -> None:
    starts, rec, metrics = line(rate=200, burst=2, wait_ms=1_000)
    for i in range(6):
        starts.submit(f"d{i}", request(ControlAction.START, f"r{i}"))
    assert rec.handled == [("d0", "r0"), ("d1", "r1")]  # the burst, in the caller's turn
    assert metrics.snapshot()["snlpgw_runtime_admission_waiting"] == 4
    await rec.until_handled(6)
    assert rec.handled == [(f"d{i}", f"r{i}") for i in range(6)]
    snap = metrics.snapshot()
    assert snap["snlpgw_runtime_admission_paced_total"] == 4
    assert snap["snlpgw_runtime_admission_waiting"] == 0
    assert snap['snlpgw_runtime_admission_wait_ms{stat="count"}'] == 4
    assert snap['snlpgw_runtime_admission_wait_ms{stat="max"}'] >= 15.0  # the 4th waited 4 x 5 ms
    assert rec.replies == []


async def test_a_devices_later_requests_wait_behind_its_start_and_others_do_not() -> None:
    starts, rec, _ = line(rate=50, burst=1, wait_ms=1_000)
    starts.submit("a", request(ControlAction.START, "a-start"))
    starts.submit("b", request(ControlAction.RESTART, "b-restart"))  # paced: 20 ms
    starts.submit("b", request(ControlAction.STOP, "b-stop"))  # behind b's restart
    starts.submit("a", request(ControlAction.PAUSE, "a-pause"))  # a waits for nothing: at once
    assert rec.handled == [("a", "a-start"), ("a", "a-pause")]
    await rec.until_handled(4)
    assert rec.handled[2:] == [("b", "b-restart"), ("b", "b-stop")]
    starts.submit("b", request(ControlAction.PAUSE, "b-pause"))  # nothing waits any more
    assert rec.handled[-1] == ("b", "b-pause")


async def test_a_start_past_the_longest_wait_is_refused_overloaded_at_once() -> None:
    starts, rec, metrics = line(rate=10, burst=1, wait_ms=150)
    for i in range(4):
        starts.submit(f"d{i}", request(ControlAction.START, f"r{i}"))
    assert rec.handled == [("d0", "r0")]  # r1 waits 100 ms; r2 (200) and r3 (200) would not fit
    assert [(dev, r.request_id, r.accepted, r.reason) for dev, r in rec.replies] == [
        ("d2", "r2", False, ControlRefusal.OVERLOADED),
        ("d3", "r3", False, ControlRefusal.OVERLOADED),
    ]
    assert all(r.action == "start" and r.detail for _, r in rec.replies)
    assert metrics.snapshot()["snlpgw_runtime_admission_refused_total"] == 2
    await rec.until_handled(2)
    assert rec.handled == [("d0", "r0"), ("d1", "r1")]


async def test_nothing_waiting_is_handled_after_close() -> None:
    starts, rec, metrics = line(rate=20, burst=1, wait_ms=1_000)
    starts.submit("d0", request(ControlAction.START, "r0"))
    starts.submit("d1", request(ControlAction.START, "r1"))
    starts.submit("d1", request(ControlAction.STOP, "r2"))
    starts.close()
    assert metrics.snapshot()["snlpgw_runtime_admission_waiting"] == 0
    await asyncio.sleep(0.2)  # four times the paced start's 50 ms slot
    assert rec.handled == [("d0", "r0")]
    starts.submit("d1", request(ControlAction.STOP, "r3"))  # d1 no longer waits for anything
    assert rec.handled[-1] == ("d1", "r3")


async def test_one_device_holds_at_most_its_share_of_the_line() -> None:
    starts, rec, metrics = line(rate=10, burst=1, wait_ms=10_000)
    starts.submit("d", request(ControlAction.START, "d-start"))  # the burst: at once
    starts.submit("hog", request(ControlAction.START, "hog-start"))  # waits 100 ms
    for i in range(PER_DEVICE + 1):  # stops behind it: PER_DEVICE - 1 fit, two do not
        starts.submit("hog", request(ControlAction.STOP, f"hog-stop-{i}"))
    starts.submit("other", request(ControlAction.START, "other-start"))  # its own slot: 200 ms
    refused = [(dev, r.request_id, r.reason) for dev, r in rec.replies]
    assert refused == [
        ("hog", f"hog-stop-{i}", ControlRefusal.OVERLOADED) for i in (PER_DEVICE - 1, PER_DEVICE)
    ]
    assert all("this device" in (r.detail or "") for _, r in rec.replies)
    assert metrics.snapshot()["snlpgw_runtime_admission_waiting"] == PER_DEVICE + 1
    await rec.until_handled(PER_DEVICE + 2)
    assert rec.handled[-1] == ("other", "other-start")
    assert metrics.snapshot()["snlpgw_runtime_admission_refused_total"] == 2


async def test_a_request_whose_handling_raises_does_not_strand_the_ones_behind_it() -> None:
    rec, metrics = Recorded(), Metrics()

    def handle(device: str, req: ControlRequest) -> None:
        if device == "bad":
            raise RuntimeError("boom")
        rec.handle(device, req)

    config = AdmissionConfig(rate_per_s=100, burst=1, max_wait_ms=1_000)
    starts = StartLine(
        config, handle=handle, reply=rec.reply, would_refuse=rec.would_refuse, metrics=metrics
    )
    starts.submit("first", request(ControlAction.START, "r0"))
    starts.submit("bad", request(ControlAction.START, "r1"))
    starts.submit("good", request(ControlAction.START, "r2"))
    await rec.until_handled(2)
    assert rec.handled == [("first", "r0"), ("good", "r2")]


async def test_a_request_the_runtime_refuses_anyway_takes_no_slot() -> None:
    starts, rec, metrics = line(rate=10, burst=1, wait_ms=150)
    rec.doomed = {"offline-1", "offline-2"}
    starts.submit("d0", request(ControlAction.START, "r0"))  # the one slot of the burst
    starts.submit("d1", request(ControlAction.START, "offline-1"))  # refused by its runtime
    starts.submit("d2", request(ControlAction.RESUME, "offline-2"))
    assert rec.handled == [("d0", "r0"), ("d1", "offline-1"), ("d2", "offline-2")]
    starts.submit("d3", request(ControlAction.START, "r3"))  # the next slot: 100 ms ahead
    assert rec.replies == []  # 300 ms ahead, past the 150 ms wait, had the others taken slots
    await rec.until_handled(4)
    assert metrics.snapshot()["snlpgw_runtime_admission_paced_total"] == 1


async def test_a_devices_board_events_wait_behind_what_it_has_waiting() -> None:
    starts, rec, metrics = line(rate=50, burst=1, wait_ms=1_000)
    starts.submit("d0", request(ControlAction.START, "r0"))
    starts.after("d0", rec.run("d0", "event-now"))  # nothing of d0 waits: at once
    starts.submit("d1", request(ControlAction.START, "r1"))  # waits 20 ms
    assert "d1" in starts
    assert "d0" not in starts
    for i in range(PER_DEVICE):  # PER_DEVICE - 1 fit behind r1; the last is dropped
        starts.after("d1", rec.run("d1", f"event-{i}"))
    assert rec.handled == [("d0", "r0"), ("d0", "event-now")]
    await rec.until_handled(2 + PER_DEVICE)
    assert rec.handled[2:] == [("d1", "r1")] + [("d1", f"event-{i}") for i in range(PER_DEVICE - 1)]
    assert metrics.snapshot()["snlpgw_runtime_admission_dropped_total"] == 1


async def test_restores_take_slots_past_the_longest_wait_and_are_never_refused() -> None:
    starts, rec, metrics = line(rate=20, burst=1, wait_ms=0)
    for i in range(3):
        starts.restore(f"d{i}", rec.run(f"d{i}", f"restore-{i}"))
    assert rec.handled == [("d0", "restore-0")]
    starts.submit("d3", request(ControlAction.START, "start-3"))  # no slot within 0 ms
    assert [(d, r.reason) for d, r in rec.replies] == [("d3", ControlRefusal.OVERLOADED)]
    starts.submit("d1", request(ControlAction.STOP, "stop-1"))  # behind d1's restore
    await rec.until_handled(4)
    assert rec.handled[1:] == [("d1", "restore-1"), ("d1", "stop-1"), ("d2", "restore-2")]
    snap = metrics.snapshot()
    assert snap["snlpgw_runtime_admission_paced_total"] == 2
    assert snap['snlpgw_runtime_admission_wait_ms{stat="count"}'] == 2


async def test_a_released_devices_waiting_requests_are_refused_and_the_rest_forgotten() -> None:
    starts, rec, metrics = line(rate=20, burst=1, wait_ms=1_000)
    starts.submit("d0", request(ControlAction.START, "r0"))
    starts.submit("moved", request(ControlAction.START, "moved-start"))  # waits 50 ms
    starts.after("moved", rec.run("moved", "moved-event"))
    starts.submit("moved", request(ControlAction.STOP, "moved-stop"))
    starts.submit("d2", request(ControlAction.START, "r2"))  # waits 100 ms
    starts.release("moved")
    starts.release("never-waited")  # nothing of it in the line: nothing to do
    assert [(d, r.request_id, r.reason) for d, r in rec.replies] == [
        ("moved", "moved-start", ControlRefusal.OVERLOADED),
        ("moved", "moved-stop", ControlRefusal.OVERLOADED),
    ]
    assert all("another gateway" in (r.detail or "") for _, r in rec.replies)
    assert "moved" not in starts
    await rec.until_handled(2)
    assert rec.handled == [("d0", "r0"), ("d2", "r2")]
    assert metrics.snapshot()["snlpgw_runtime_admission_waiting"] == 0
