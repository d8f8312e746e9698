"""Small shell parts of the console: the live-stream hub's bound and shutdown, and the ops alarm
listeners the fleet page reads (a listener that fails costs nothing but a log line)."""

from __future__ import annotations

from gateway.console.web import LiveHub
from gateway.metrics import Metrics
from gateway.service import Ops


class _Publisher:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def publish(self, topic: str, payload: bytes, *, qos: int = 0, retain: bool = False) -> None:
        self.sent.append((topic, payload))


def test_live_hub_is_bounded_and_wakes_everyone_then_closes() -> None:
    hub = LiveHub(limit=2)
    first, second = hub.join(), hub.join()
    assert first is not None
    assert second is not None
    assert hub.join() is None  # over the limit: the page answers 503
    hub.committed("any-instance")
    assert first.is_set()
    assert second.is_set()
    hub.leave(first)
    assert len(hub) == 1
    second.clear()
    hub.close()
    assert second.is_set()  # a stream wakes and sees the hub closed
    assert hub.join() is None


def test_ops_alarm_listeners_are_told_and_isolated() -> None:
    told: list[tuple[str, str | None]] = []

    def broken(alarm: str, device: str | None, at_ms: int) -> None:
        raise RuntimeError("listener bug")

    publisher = _Publisher()
    ops = Ops("gw-1", publisher, Metrics())  # type: ignore[arg-type]  # publish() is all it uses
    ops.listeners.extend([broken, lambda alarm, device, at_ms: told.append((alarm, device))])
    ops.alarm("board_command_failed", device="aa_bb_cc_dd_ee_01", cmd="play")
    assert told == [("board_command_failed", "aa_bb_cc_dd_ee_01")]
    assert len(publisher.sent) == 1  # published before the listeners, whatever they do
