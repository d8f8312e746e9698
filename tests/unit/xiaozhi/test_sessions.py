"""The session core's rules, table-driven, with a fake clock: effects out for events in."""

from __future__ import annotations

import itertools

import pytest

from gateway.xiaozhi.sessions import (
    CloseReason,
    ControlDrop,
    ControlRefused,
    CoreState,
    Effect,
    InSession,
    Randomness,
    Session,
    SessionClosed,
    SessionCore,
    SessionOpened,
    StaleGoodbye,
    session_nonce,
)

A = "aa_bb_cc_dd_ee_01"
B = "aa_bb_cc_dd_ee_02"
C = "aa_bb_cc_dd_ee_03"


def seeded(ssrcs: list[int] | None = None) -> Randomness:
    counter = itertools.count(1)
    ssrc_iter = iter(ssrcs or range(100, 10_000))
    return Randomness(
        token=lambda n: next(counter).to_bytes(n, "big"),
        ssrc=lambda: next(ssrc_iter),
    )


def serving(
    *,
    idle_s: float = 150.0,
    max_sessions: int = 1000,
    hellos_per_s: float = 1.0,
    hello_burst: float = 10.0,
    listening_by_default: bool = True,
    rand: Randomness | None = None,
) -> SessionCore:
    core = SessionCore(
        idle_s=idle_s,
        max_sessions=max_sessions,
        hellos_per_s=hellos_per_s,
        hello_burst=hello_burst,
        listening_by_default=listening_by_default,
        rand=rand or seeded(),
    )
    core.serving()
    return core


def opened(effects: list[Effect]) -> Session:
    assert isinstance(effects[-1], SessionOpened)
    return effects[-1].session


def test_nonce_layout_matches_spec() -> None:
    assert session_nonce(0x11223344).hex() == "01000000" + "11223344" + "00000000" + "00000000"


def test_a_sessions_nonce_is_built_from_its_ssrc() -> None:
    core = serving(rand=seeded([0x0A0B0C0D]))
    assert opened(core.hello(A, 0.0)).nonce == session_nonce(0x0A0B0C0D)


def test_hello_opens_a_fresh_session_replacing_the_devices_own() -> None:
    core = SessionCore(idle_s=150)  # real randomness
    core.serving()
    first = opened(core.hello(A, now=0.0))
    effects = core.hello(A, now=1.0)
    assert effects[0] == SessionClosed(first, CloseReason.REPLACED)
    assert (effects[0].side, effects[0].announce) == ("device", False)
    second = opened(effects)
    assert (second.session_id, second.key, second.ssrc) != (first.session_id, first.key, first.ssrc)
    assert (len(second.key), len(second.session_id), second.opened_at) == (16, 32, 1.0)
    assert core.by_dev(A) is second
    assert len(core) == 1


def test_the_core_answers_hellos_only_while_serving() -> None:
    core = SessionCore(idle_s=150, rand=seeded())
    assert core.state is CoreState.STARTING
    assert core.hello(A, 0.0) == [ControlRefused(ControlDrop.NOT_READY)]
    core.serving()
    assert core.state is CoreState.SERVING
    a = opened(core.hello(A, 0.0))
    with pytest.raises(RuntimeError, match="SERVING"):
        core.serving()
    assert core.stop() == [SessionClosed(a, CloseReason.SHUTDOWN)]
    assert core.state is CoreState.STOPPED
    assert core.hello(B, 1.0) == [ControlRefused(ControlDrop.NOT_READY)]
    assert len(core) == 0


def test_closing_effects_say_which_side_ended_and_whether_the_device_is_told() -> None:
    s = Session(A, "sid", 1, bytes(16), 0.0)
    sides = {
        reason: (SessionClosed(s, reason).side, SessionClosed(s, reason).announce)
        for reason in CloseReason
    }
    assert sides == {
        CloseReason.DEVICE_GOODBYE: ("device", False),
        CloseReason.REPLACED: ("device", False),
        CloseReason.GATEWAY_GOODBYE: ("gateway", True),
        CloseReason.IDLE: ("gateway", True),
        CloseReason.SHUTDOWN: ("gateway", False),
    }


@pytest.mark.parametrize(
    ("goodbye_sid", "closes"),
    [("current", True), ("stale", False), (None, False), ("", False)],
)
def test_goodbye_closes_only_the_named_session(goodbye_sid: str | None, closes: bool) -> None:
    core = serving()
    s = opened(core.hello(A, 0.0))
    sid = {"current": s.session_id, "stale": "0" * 32}.get(goodbye_sid or "", goodbye_sid)
    expected: Effect = (
        SessionClosed(s, CloseReason.DEVICE_GOODBYE)
        if closes
        else ControlRefused(ControlDrop.STALE_GOODBYE)
    )
    assert core.goodbye(A, sid) == [expected]
    assert (core.by_dev(A) is None) is closes


def test_goodbye_from_a_device_without_a_session_is_stale() -> None:
    assert serving().goodbye(B, "x") == [ControlRefused(ControlDrop.STALE_GOODBYE)]


def test_listen_or_abort_for_a_stale_session_is_answered_with_its_own_session_id() -> None:
    core = serving()
    s = opened(core.hello(A, 0.0))
    assert core.in_session(A, "old", 5.0) == [
        ControlRefused(ControlDrop.NO_SESSION),
        StaleGoodbye(A, "old"),
    ]
    assert core.in_session(B, None, 5.0) == [
        ControlRefused(ControlDrop.NO_SESSION),
        StaleGoodbye(B, None),
    ]
    assert core.next_deadline() == 150.0  # a stale message moves nothing
    assert core.in_session(A, s.session_id, 5.0) == [InSession(s)]
    assert core.next_deadline() == 155.0


def test_mcp_moves_only_the_session_it_names_and_flows_without_one() -> None:
    core = serving()
    s = opened(core.hello(A, 0.0))
    assert core.mcp(A, "", 10.0) is None
    assert core.mcp(B, "", 10.0) is None
    assert core.next_deadline() == 150.0
    assert core.mcp(A, s.session_id, 10.0) is s
    assert core.next_deadline() == 160.0


@pytest.mark.parametrize(
    ("touch_at", "expire_at", "expired"),
    [
        (None, 149.9, False),
        (None, 150.0, True),
        (100.0, 249.9, False),
        (100.0, 250.0, True),
        (-5.0, 150.0, True),  # a touch from the past never moves the deadline back
    ],
)
def test_idle_expiry(touch_at: float | None, expire_at: float, expired: bool) -> None:
    core = serving()
    s = opened(core.hello(A, 0.0))
    if touch_at is not None:
        core.touch(s, touch_at)
    assert core.next_deadline() == (touch_at if touch_at and touch_at > 0 else 0.0) + 150
    result = core.expire(expire_at)
    assert (result == [SessionClosed(s, CloseReason.IDLE)]) is expired
    assert (core.next_deadline() is None) is expired


def test_next_deadline_is_the_earliest_of_all_sessions() -> None:
    core = serving(idle_s=10.0)
    a = opened(core.hello(A, 0.0))
    core.hello(B, 3.0)
    assert core.next_deadline() == 10.0
    assert core.expire(10.0) == [SessionClosed(a, CloseReason.IDLE)]
    assert core.next_deadline() == 13.0


def test_touching_a_closed_or_replaced_session_changes_nothing() -> None:
    core = serving(idle_s=10.0)
    old = opened(core.hello(A, 0.0))
    new = opened(core.hello(A, 1.0))
    core.touch(old, 5.0)
    assert core.next_deadline() == 11.0
    core.close(A)
    core.touch(new, 6.0)
    assert core.next_deadline() is None


def test_gateway_close_carries_the_current_session_and_is_told() -> None:
    core = serving()
    s = opened(core.hello(A, 0.0))
    effects = core.close(A)
    assert effects == [SessionClosed(s, CloseReason.GATEWAY_GOODBYE)]
    assert (effects[0].side, effects[0].announce) == ("gateway", True)
    assert core.close(A) == []


def test_current_requires_the_exact_session_id() -> None:
    core = serving(rand=Randomness(token=lambda n: bytes([0xAB] * n)))
    s = opened(core.hello(A, 0.0))
    assert core.current(A, s.session_id) is s
    assert core.current(A, s.session_id.upper()) is None
    assert core.current(A, None) is None
    assert core.current(B, s.session_id) is None


def test_ssrc_collision_and_zero_are_redrawn_and_the_top_bit_is_the_downlinks() -> None:
    core = serving(rand=seeded([7, 0, 7, 0x8000_0009]))
    assert opened(core.hello(A, 0.0)).ssrc == 7
    assert opened(core.hello(B, 0.0)).ssrc == 9


def test_ssrc_space_exhaustion_raises() -> None:
    core = serving(rand=seeded([5] * 100))
    core.hello(A, 0.0)
    with pytest.raises(RuntimeError, match="free ssrc"):
        core.hello(B, 0.0)


def test_the_table_is_capped_but_a_device_with_a_session_can_always_renew_it() -> None:
    core = serving(max_sessions=2)
    core.hello(A, 0.0)
    core.hello(B, 0.0)
    assert core.hello(C, 0.0) == [ControlRefused(ControlDrop.SESSION_CAP)]
    renewed = core.hello(A, 1.0)
    assert isinstance(renewed[0], SessionClosed)
    assert isinstance(renewed[1], SessionOpened)
    assert len(core) == 2


def test_hellos_are_budgeted_per_device() -> None:
    core = serving(hellos_per_s=0.1, hello_burst=2)
    assert [type(e[-1]) for e in (core.hello(A, 0.0) for _ in range(3))] == [
        SessionOpened,
        SessionOpened,
        ControlRefused,
    ]
    assert core.hello(A, 0.0) == [ControlRefused(ControlDrop.HELLO_RATE)]
    assert isinstance(core.hello(B, 0.0)[-1], SessionOpened)  # its own budget
    assert isinstance(core.hello(A, 10.0)[-1], SessionOpened)  # one back after 10 s
    assert len(core.hellos) == 2


@pytest.mark.parametrize("default", [True, False])
def test_listening_is_remembered_per_device_also_before_its_session(default: bool) -> None:
    core = serving(listening_by_default=default)
    assert core.listening(A) is default
    assert core.set_listening(A, not default) is None  # no session yet
    assert core.listening(A) is (not default)
    s = opened(core.hello(A, 0.0))
    assert core.set_listening(A, default) is s
    assert core.listening(A) is default
    assert core.listening(B) is default


@pytest.mark.parametrize(("idle_s", "max_sessions"), [(0.0, 10), (-1.0, 10), (10.0, 0)])
def test_bad_limits_are_refused(idle_s: float, max_sessions: int) -> None:
    with pytest.raises(ValueError, match="idle_s"):
        SessionCore(idle_s=idle_s, max_sessions=max_sessions)
