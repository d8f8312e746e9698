"""PresenceTracker core: a fake clock (floats) drives every transition."""

from __future__ import annotations

import pytest

from gateway.board.model import OnlineStatus, PresenceChange
from gateway.board.presence import Flapping, Liveness, PresenceTracker


def tracker(threshold: int = 4, window: float = 60.0) -> PresenceTracker:
    return PresenceTracker(
        "aa_bb_cc_dd_ee_ff",
        heartbeat_s=30.0,
        missed_heartbeats=3,
        flap_window_s=window,
        flap_threshold=threshold,
    )


def changes(effects: list[PresenceChange | Flapping]) -> list[tuple[bool, str]]:
    return [(e.online, e.reason) for e in effects if isinstance(e, PresenceChange)]


@pytest.mark.parametrize(
    ("first", "reason"),
    [
        (lambda p, t: p.on_heartbeat(t), "heartbeat"),
        (lambda p, t: p.on_activity(t), "activity"),
        (lambda p, t: p.on_status(OnlineStatus(online=True, by_gateway=False), t), "status"),
    ],
)
def test_online_on_first_sign_of_life(first, reason) -> None:  # type: ignore[no-untyped-def]
    p = tracker()
    assert p.state is Liveness.UNKNOWN
    assert p.next_deadline() is None
    assert changes(first(p, 1.0)) == [(True, reason)]
    assert p.online
    assert p.next_deadline() == 91.0


def test_offline_after_missed_heartbeats_and_back() -> None:
    p = tracker()
    p.on_heartbeat(0.0)
    assert p.on_heartbeat(30.0) == []
    assert p.next_deadline() == 120.0
    assert p.tick(119.9) == []
    assert changes(p.tick(120.0)) == [(False, "missed_heartbeats")]
    assert p.next_deadline() is None
    assert p.tick(500.0) == []
    assert changes(p.on_heartbeat(501.0)) == [(True, "heartbeat")]


def test_lwt_status_goes_offline_at_once() -> None:
    p = tracker()
    p.on_heartbeat(0.0)
    assert changes(p.on_status(OnlineStatus(online=False, by_gateway=False), 5.0)) == [
        (False, "lwt")
    ]
    assert p.next_deadline() is None
    assert p.on_status(OnlineStatus(online=False, by_gateway=False), 6.0) == []


def test_gateway_written_status_is_ignored() -> None:
    p = tracker()
    assert p.on_status(OnlineStatus(online=True, by_gateway=True), 0.0) == []
    assert p.state is Liveness.UNKNOWN
    p.on_heartbeat(1.0)
    assert p.on_status(OnlineStatus(online=False, by_gateway=True), 2.0) == []
    assert p.online


def test_flapping_alarm_once_per_threshold_within_window() -> None:
    p = tracker(threshold=4, window=60.0)
    effects: list[PresenceChange | Flapping] = []
    lwt = OnlineStatus(online=False, by_gateway=False)
    for t in (0.0, 10.0, 20.0, 30.0):
        effects += p.on_heartbeat(t) if p.state is not Liveness.ONLINE else p.on_status(lwt, t)
    flaps = [e for e in effects if isinstance(e, Flapping)]
    assert flaps == [Flapping("aa_bb_cc_dd_ee_ff", 4, 60.0)]
    # the count starts again: three more changes raise nothing
    more = p.on_heartbeat(40.0) + p.on_status(lwt, 41.0) + p.on_heartbeat(42.0)
    assert not [e for e in more if isinstance(e, Flapping)]


def test_slow_changes_are_not_flapping() -> None:
    p = tracker(threshold=2, window=10.0)
    p.on_heartbeat(0.0)
    effects = p.tick(90.0)
    assert changes(effects) == [(False, "missed_heartbeats")]
    assert not [e for e in effects if isinstance(e, Flapping)]
