"""Session table core: hello / goodbye / idle expiry, driven by a fake clock."""

from __future__ import annotations

import itertools

import pytest

from gateway.xiaozhi.sessions import CloseReason, Randomness, SessionTable, session_nonce

A = "aa_bb_cc_dd_ee_01"
B = "aa_bb_cc_dd_ee_02"


def seeded(ssrcs: list[int] | None = None) -> Randomness:
    counter = itertools.count(1)
    ssrc_iter = iter(ssrcs or range(100, 10_000))
    return Randomness(
        token=lambda n: next(counter).to_bytes(n, "big"),
        ssrc=lambda: next(ssrc_iter),
    )


def test_nonce_layout_matches_spec() -> None:
    assert session_nonce(0x11223344).hex() == "01000000" + "11223344" + "00000000" + "00000000"


def test_a_sessions_nonce_is_built_from_its_ssrc() -> None:
    session = SessionTable(idle_s=150, rand=seeded([0x0A0B0C0D])).hello(A, now=0.0).session
    assert session.nonce == session_nonce(0x0A0B0C0D)


def test_hello_opens_fresh_session_with_new_secrets_each_time() -> None:
    table = SessionTable(idle_s=150)
    first = table.hello(A, now=0.0).session
    second = table.hello(A, now=1.0)
    assert second.replaced is first
    assert first.closed is CloseReason.REPLACED
    s = second.session
    assert (s.session_id, s.key, s.ssrc) != (first.session_id, first.key, first.ssrc)
    assert len(s.key) == 16
    assert len(s.session_id) == 32
    assert table.by_ssrc(first.ssrc) is None
    assert table.by_ssrc(s.ssrc) is s
    assert table.by_dev(A) is s
    assert len(table) == 1


@pytest.mark.parametrize(
    ("goodbye_sid", "closes"),
    [("current", True), ("stale", False), (None, False), ("", False)],
)
def test_goodbye_closes_only_the_named_session(goodbye_sid: str | None, closes: bool) -> None:
    table = SessionTable(idle_s=150, rand=seeded())
    s = table.hello(A, 0.0).session
    sid = {"current": s.session_id, "stale": "0" * 32}.get(goodbye_sid or "", goodbye_sid)
    closed = table.goodbye(A, sid, CloseReason.DEVICE_GOODBYE)
    assert (closed is s) is closes
    assert (table.by_dev(A) is None) is closes
    if closes:
        assert s.closed is CloseReason.DEVICE_GOODBYE


def test_goodbye_for_unknown_device_is_none() -> None:
    table = SessionTable(idle_s=150)
    assert table.goodbye(B, "x", CloseReason.DEVICE_GOODBYE) is None


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
    table = SessionTable(idle_s=150)
    s = table.hello(A, 0.0).session
    if touch_at is not None:
        table.touch(s, touch_at)
    assert table.next_deadline() == (touch_at if touch_at and touch_at > 0 else 0.0) + 150
    result = table.expire(expire_at)
    assert (result == [s]) is expired
    assert (s.closed is CloseReason.IDLE) is expired
    assert (table.next_deadline() is None) is expired


def test_next_deadline_is_earliest_of_all_sessions() -> None:
    table = SessionTable(idle_s=10, rand=seeded())
    table.hello(A, 0.0)
    table.hello(B, 3.0)
    assert table.next_deadline() == 10.0
    assert [s.dev for s in table.expire(10.0)] == [A]
    assert table.next_deadline() == 13.0


def test_current_requires_exact_session_id() -> None:
    table = SessionTable(idle_s=10)
    s = table.hello(A, 0.0).session
    assert table.current(A, s.session_id) is s
    assert table.current(A, s.session_id.upper()) is None
    assert table.current(A, None) is None
    assert table.current(B, s.session_id) is None


def test_ssrc_collision_and_zero_are_redrawn() -> None:
    table = SessionTable(idle_s=10, rand=seeded([7, 0, 7, 9]))
    assert table.hello(A, 0.0).session.ssrc == 7
    assert table.hello(B, 0.0).session.ssrc == 9


def test_ssrc_space_exhaustion_raises() -> None:
    table = SessionTable(idle_s=10, rand=seeded([5] * 100))
    table.hello(A, 0.0)
    with pytest.raises(RuntimeError, match="free ssrc"):
        table.hello(B, 0.0)


def test_close_all_and_touch_after_close() -> None:
    table = SessionTable(idle_s=10, rand=seeded())
    a = table.hello(A, 0.0).session
    table.hello(B, 0.0)
    assert {s.dev for s in table.close_all()} == {A, B}
    assert a.closed is CloseReason.SHUTDOWN
    assert len(table) == 0
    table.touch(a, 5.0)
    assert a.last_activity == 0.0


def test_idle_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        SessionTable(idle_s=0)


def test_the_table_is_capped_but_a_device_with_a_session_can_always_renew_it() -> None:
    table = SessionTable(idle_s=150, max_sessions=2, rand=seeded())
    assert table.hello(A, 0.0) is not None
    assert table.hello(B, 0.0) is not None
    assert table.hello("aa_bb_cc_dd_ee_03", 0.0) is None
    renewed = table.hello(A, 1.0)
    assert renewed is not None
    assert renewed.replaced is not None
    assert len(table) == 2
    with pytest.raises(ValueError, match="max_sessions"):
        SessionTable(idle_s=150, max_sessions=0)
