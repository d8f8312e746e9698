"""The admission line on a real loop: starts paced in arrival order, a device's later requests
kept behind its waiting start, refusal past the wait, nothing handled after close."""

from __future__ import annotations

import asyncio

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
    return StartLine(config, handle=rec.handle, reply=rec.reply, metrics=metrics), rec, metrics


async def test_a_herd_of_starts_is_paced_in_arrival_order() -> None:
    starts, rec, metrics = line(rate=200, burst=2, wait_ms=1_000)
    for i in range(6):
        starts.submit(f"d{i}", request(ControlAction.START, f"r{i}"))
    assert rec.handled == [("d0", "r0"), ("d1", "r1")]  # the burst, in the caller's turn
    assert metrics.snapshot()["snlpgw_runtime_starts_waiting"] == 4
    await rec.until_handled(6)
    assert rec.handled == [(f"d{i}", f"r{i}") for i in range(6)]
    snap = metrics.snapshot()
    assert snap["snlpgw_runtime_starts_paced_total"] == 4
    assert snap["snlpgw_runtime_starts_waiting"] == 0
    assert snap['snlpgw_runtime_start_wait_ms{stat="count"}'] == 4
    assert snap['snlpgw_runtime_start_wait_ms{stat="max"}'] >= 15.0  # the 4th waited 4 x 5 ms
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
    starts.submit("b", request(ControlAction.RESUME, "b-resume"))  # nothing waits any more
    assert rec.handled[-1] == ("b", "b-resume")


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
    assert metrics.snapshot()["snlpgw_runtime_starts_overloaded_total"] == 2
    await rec.until_handled(2)
    assert rec.handled == [("d0", "r0"), ("d1", "r1")]


async def test_nothing_waiting_is_handled_after_close() -> None:
    starts, rec, metrics = line(rate=20, burst=1, wait_ms=1_000)
    starts.submit("d0", request(ControlAction.START, "r0"))
    starts.submit("d1", request(ControlAction.START, "r1"))
    starts.submit("d1", request(ControlAction.STOP, "r2"))
    starts.close()
    assert metrics.snapshot()["snlpgw_runtime_starts_waiting"] == 0
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
    assert metrics.snapshot()["snlpgw_runtime_starts_waiting"] == PER_DEVICE + 1
    await rec.until_handled(PER_DEVICE + 2)
    assert rec.handled[-1] == ("other", "other-start")
    assert metrics.snapshot()["snlpgw_runtime_starts_overloaded_total"] == 2


async def test_a_request_whose_handling_raises_does_not_strand_the_ones_behind_it() -> None:
    rec, metrics = Recorded(), Metrics()

    def handle(device: str, req: ControlRequest) -> None:
        if device == "bad":
            raise RuntimeError("boom")
        rec.handle(device, req)

    config = AdmissionConfig(rate_per_s=100, burst=1, max_wait_ms=1_000)
    starts = StartLine(config, handle=handle, reply=rec.reply, metrics=metrics)
    starts.submit("first", request(ControlAction.START, "r0"))
    starts.submit("bad", request(ControlAction.START, "r1"))
    starts.submit("good", request(ControlAction.START, "r2"))
    await rec.until_handled(2)
    assert rec.handled == [("first", "r0"), ("good", "r2")]
