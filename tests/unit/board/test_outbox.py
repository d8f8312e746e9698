"""Outbox core: driven by a fake clock (plain floats), every rule of the module docstring."""

from __future__ import annotations

import pytest

from gateway.board.model import (
    AckStatus,
    BoardAck,
    Envelope,
    OutcomeKind,
)
from gateway.board.outbox import Done, Outbox, Send


def env(i: str, ttl_ms: int = 30_000) -> Envelope:
    return Envelope(i, "PLAY_MEDIA", b"{}", ttl_ms=ttl_ms)


def box(*, online: bool = True, limit: int = 8, resends: int = 3, window: int = 1) -> Outbox:
    b = Outbox(ack_timeout_s=3.0, max_resends=resends, limit=limit, window=window)
    assert b.set_online(online, 0.0) == []
    return b


def sent(effects: list[Send | Done]) -> list[tuple[str, int]]:
    return [(e.envelope.id, e.sends) for e in effects if isinstance(e, Send)]


def done(effects: list[Send | Done]) -> list[tuple[str, OutcomeKind]]:
    return [(e.envelope.id, e.outcome.kind) for e in effects if isinstance(e, Done)]


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (AckStatus.ACCEPTED, OutcomeKind.ACCEPTED),
        (AckStatus.DUPLICATE, OutcomeKind.DUPLICATE),
        (AckStatus.REJECTED, OutcomeKind.REJECTED),
        (AckStatus.BUSY, OutcomeKind.BUSY),
    ],
)
def test_ack_status_maps_to_outcome(status: AckStatus, kind: OutcomeKind) -> None:
    b = box()
    assert sent(b.submit(env("c1"), 1.0)) == [("c1", 1)]
    effects = b.on_ack(BoardAck("c1", status, code="E1"), 1.25)
    assert effects is not None
    (d,) = effects
    assert isinstance(d, Done)
    assert d.outcome.kind is kind
    assert d.outcome.code == "E1"
    assert d.outcome.ack_latency_s == pytest.approx(0.25)
    assert d.outcome.sends == 1
    assert d.outcome.delivered is (kind in {OutcomeKind.ACCEPTED, OutcomeKind.DUPLICATE})
    assert len(b) == 0
    assert b.next_deadline() is None


def test_window_of_one_sends_one_at_a_time_in_order() -> None:
    b = box()
    assert sent(b.submit(env("c1"), 0.0)) == [("c1", 1)]
    assert b.submit(env("c2"), 0.1) == []
    assert b.submit(env("c3"), 0.2) == []
    assert b.in_flight() == ("c1",)
    effects = b.on_ack(BoardAck("c1", AckStatus.ACCEPTED), 0.5)
    assert effects is not None
    assert done(effects) == [("c1", OutcomeKind.ACCEPTED)]
    assert sent(effects) == [("c2", 1)]
    effects = b.on_ack(BoardAck("c2", AckStatus.ACCEPTED), 0.6)
    assert effects is not None
    assert sent(effects) == [("c3", 1)]


def test_resend_same_id_until_exhausted_then_failed() -> None:
    b = box(resends=2)
    b.submit(env("c1"), 0.0)
    b.submit(env("c2"), 0.0)
    assert b.next_deadline() == 3.0
    assert b.tick(2.99) == []
    assert sent(b.tick(3.0)) == [("c1", 2)]
    assert b.next_deadline() == 6.0
    assert sent(b.tick(6.0)) == [("c1", 3)]
    effects = b.tick(9.0)
    assert done(effects) == [("c1", OutcomeKind.FAILED)]
    assert sent(effects) == [("c2", 1)]
    d = effects[0]
    assert isinstance(d, Done)
    assert d.outcome.sends == 3


def test_resend_is_marked_and_latency_counts_from_first_send() -> None:
    b = box()
    b.submit(env("c1"), 0.0)
    (s,) = b.tick(3.0)
    assert isinstance(s, Send)
    assert s.resend
    effects = b.on_ack(BoardAck("c1", AckStatus.DUPLICATE), 3.5)
    assert effects is not None
    d = effects[0]
    assert isinstance(d, Done)
    assert d.outcome.ack_latency_s == pytest.approx(3.5)
    assert d.outcome.sends == 2
    assert d.outcome.delivered


def test_offline_board_keeps_commands_until_ttl_then_expired() -> None:
    b = box(online=False)
    assert b.submit(env("c1", ttl_ms=5_000), 0.0) == []
    assert b.submit(env("c2", ttl_ms=8_000), 1.0) == []
    assert b.next_deadline() == 5.0
    assert b.tick(4.0) == []
    assert done(b.tick(5.0)) == [("c1", OutcomeKind.EXPIRED)]
    assert b.next_deadline() == 9.0
    assert sent(b.set_online(True, 6.0)) == [("c2", 1)]


def test_in_flight_command_requeued_when_board_drops_and_resent_on_return() -> None:
    b = box(resends=1)
    b.submit(env("c1"), 0.0)
    b.tick(3.0)  # resend 1 of 1
    assert b.set_online(False, 4.0) == []
    assert b.in_flight() == ()
    assert b.next_deadline() == 30.0  # only the ttl now
    assert b.tick(10.0) == []
    assert sent(b.set_online(True, 12.0)) == [("c1", 3)]  # same id, fresh resend budget
    assert sent(b.tick(15.0)) == [("c1", 4)]
    assert done(b.tick(18.0)) == [("c1", OutcomeKind.FAILED)]


def test_late_ack_for_requeued_command_resolves_it() -> None:
    b = box()
    b.submit(env("c1"), 0.0)
    b.set_online(False, 1.0)
    effects = b.on_ack(BoardAck("c1", AckStatus.ACCEPTED), 1.5)
    assert effects is not None
    assert done(effects) == [("c1", OutcomeKind.ACCEPTED)]


def test_ack_for_unknown_command_is_none() -> None:
    b = box()
    b.submit(env("c1"), 0.0)
    assert b.on_ack(BoardAck("zz", AckStatus.ACCEPTED), 0.5) is None
    assert b.in_flight() == ("c1",)


def test_ack_for_never_sent_command_has_no_latency() -> None:
    b = box(online=False)
    b.submit(env("c1"), 0.0)
    effects = b.on_ack(BoardAck("c1", AckStatus.ACCEPTED), 0.5)
    assert effects is not None
    d = effects[0]
    assert isinstance(d, Done)
    assert d.outcome.ack_latency_s is None
    assert d.outcome.sends == 0


def test_in_flight_command_expires_at_ttl() -> None:
    b = box(resends=10)
    b.submit(env("c1", ttl_ms=4_000), 0.0)
    b.submit(env("c2"), 0.0)
    b.tick(3.0)
    effects = b.tick(4.0)
    assert done(effects) == [("c1", OutcomeKind.EXPIRED)]
    assert sent(effects) == [("c2", 1)]


def test_overflow_refuses_newest() -> None:
    b = box(online=False, limit=2)
    b.submit(env("c1"), 0.0)
    b.submit(env("c2"), 0.0)
    effects = b.submit(env("c3"), 0.0)
    assert done(effects) == [("c3", OutcomeKind.OVERFLOW)]
    assert len(b) == 2


def test_set_online_twice_is_noop_and_cancel_all() -> None:
    b = box()
    b.submit(env("c1"), 0.0)
    b.submit(env("c2"), 0.0)
    assert b.set_online(True, 1.0) == []
    assert b.online
    assert done(b.cancel_all()) == [("c1", OutcomeKind.CANCELLED), ("c2", OutcomeKind.CANCELLED)]
    assert b.tick(100.0) == []


def test_going_offline_with_nothing_in_flight() -> None:
    b = box()
    assert b.set_online(False, 0.0) == []
    b.submit(env("c1"), 0.0)
    assert b.set_online(False, 0.0) == []
    assert not b.online


# -- pipelining (window > 1) -------------------------------------------------------------------


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window"):
        Outbox(ack_timeout_s=3.0, max_resends=3, limit=8, window=0)


def test_commands_submitted_together_leave_together_in_order() -> None:
    b = box(window=2)
    assert sent(b.submit(env("stop"), 0.0)) == [("stop", 1)]
    assert sent(b.submit(env("play"), 0.0)) == [("play", 1)]  # no wait for stop's ack
    assert sent(b.submit(env("c3"), 0.0)) == []  # the window is full
    assert b.in_flight() == ("stop", "play")
    effects = b.on_ack(BoardAck("stop", AckStatus.ACCEPTED), 0.01)
    assert effects is not None
    assert done(effects) == [("stop", OutcomeKind.ACCEPTED)]
    assert sent(effects) == [("c3", 1)]
    assert b.in_flight() == ("play", "c3")


def test_acks_in_any_order_resolve_their_own_command() -> None:
    b = box(window=3)
    for i in ("c1", "c2", "c3", "c4"):
        b.submit(env(i), 0.0)
    effects = b.on_ack(BoardAck("c2", AckStatus.REJECTED), 0.1)
    assert effects is not None
    assert done(effects) == [("c2", OutcomeKind.REJECTED)]
    assert sent(effects) == [("c4", 1)]
    assert b.in_flight() == ("c1", "c3", "c4")
    effects = b.on_ack(BoardAck("c4", AckStatus.ACCEPTED), 0.2)
    assert effects is not None
    assert done(effects) == [("c4", OutcomeKind.ACCEPTED)]
    assert sent(effects) == []
    assert b.in_flight() == ("c1", "c3")


def test_each_command_in_flight_has_its_own_ack_deadline() -> None:
    b = box(window=2, resends=1)
    b.submit(env("c1"), 0.0)
    b.submit(env("c2"), 1.0)
    assert b.next_deadline() == 3.0
    assert sent(b.tick(3.0)) == [("c1", 2)]  # c2 is not due yet
    assert b.next_deadline() == 4.0
    assert sent(b.tick(4.0)) == [("c2", 2)]
    effects = b.on_ack(BoardAck("c2", AckStatus.DUPLICATE), 4.5)
    assert effects is not None
    assert done(effects) == [("c2", OutcomeKind.DUPLICATE)]
    effects = b.tick(6.0)  # c1 out of resends: failed alone
    assert done(effects) == [("c1", OutcomeKind.FAILED)]
    assert len(b) == 0


def test_resends_due_together_keep_submit_order_and_ids() -> None:
    b = box(window=3)
    for i in ("c1", "c2", "c3"):
        b.submit(env(i), 0.0)
    effects = b.tick(3.5)  # a late timer: all three are due
    assert sent(effects) == [("c1", 2), ("c2", 2), ("c3", 2)]
    assert all(isinstance(e, Send) and e.resend for e in effects)


def test_failed_head_lets_the_next_queued_command_go() -> None:
    b = box(window=2, resends=0)
    b.submit(env("c1"), 0.0)
    b.submit(env("c2"), 1.0)
    b.submit(env("c3"), 1.0)
    effects = b.tick(3.0)
    assert done(effects) == [("c1", OutcomeKind.FAILED)]
    assert sent(effects) == [("c3", 1)]
    assert b.in_flight() == ("c2", "c3")


def test_expired_command_in_flight_frees_its_slot() -> None:
    b = box(window=2, resends=10)
    b.submit(env("c1"), 0.0)
    b.submit(env("c2", ttl_ms=2_000), 0.0)
    b.submit(env("c3"), 0.0)
    effects = b.tick(2.0)
    assert done(effects) == [("c2", OutcomeKind.EXPIRED)]
    assert sent(effects) == [("c3", 1)]
    assert b.in_flight() == ("c1", "c3")


def test_queued_command_expires_without_touching_those_in_flight() -> None:
    b = box(window=1)
    b.submit(env("c1"), 0.0)
    b.submit(env("c2", ttl_ms=1_000), 0.0)
    assert done(b.tick(1.0)) == [("c2", OutcomeKind.EXPIRED)]
    assert b.in_flight() == ("c1",)


def test_board_drop_requeues_all_in_flight_and_resends_them_in_order() -> None:
    b = box(window=2)
    for i in ("c1", "c2", "c3"):
        b.submit(env(i), 0.0)
    assert b.set_online(False, 1.0) == []
    assert b.in_flight() == ()
    assert b.next_deadline() == 30.0  # only the ttls now
    effects = b.on_ack(BoardAck("c2", AckStatus.ACCEPTED), 1.5)  # late ack, sent before the drop
    assert effects is not None
    assert done(effects) == [("c2", OutcomeKind.ACCEPTED)]
    assert sent(effects) == []  # offline: nothing leaves
    assert sent(b.set_online(True, 2.0)) == [("c1", 2), ("c3", 1)]
    assert b.in_flight() == ("c1", "c3")


def test_cancel_all_with_several_in_flight() -> None:
    b = box(window=2)
    for i in ("c1", "c2", "c3"):
        b.submit(env(i), 0.0)
    effects = b.cancel_all()
    assert done(effects) == [(i, OutcomeKind.CANCELLED) for i in ("c1", "c2", "c3")]
    assert b.in_flight() == ()
    assert sent(b.submit(env("c4"), 1.0)) == [("c4", 1)]


def test_backoff_must_be_at_least_one() -> None:
    with pytest.raises(ValueError, match="backoff"):
        Outbox(ack_timeout_s=3.0, max_resends=3, limit=8, backoff=0.5)


def test_each_resend_waits_backoff_times_longer() -> None:
    b = Outbox(ack_timeout_s=1.0, max_resends=3, limit=8, backoff=2.0)
    b.set_online(True, 0.0)
    assert sent(b.submit(env("c1"), 0.0)) == [("c1", 1)]
    assert sent(b.tick(1.0)) == [("c1", 2)]  # 1 s
    assert b.tick(2.9) == []
    assert sent(b.tick(3.0)) == [("c1", 3)]  # then 2 s
    assert sent(b.tick(7.0)) == [("c1", 4)]  # then 4 s
    assert b.tick(14.9) == []
    assert done(b.tick(15.0)) == [("c1", OutcomeKind.FAILED)]  # then 8 s


def confirmed_box(resends: int = 2, window: int = 2) -> Outbox:
    b = Outbox(ack_timeout_s=3.0, max_resends=resends, limit=8, window=window, write_confirmed=True)
    b.set_online(True, 0.0)
    return b


def test_with_write_confirmed_the_deadline_starts_when_the_send_left() -> None:
    b = confirmed_box()
    assert sent(b.submit(env("c1", ttl_ms=60_000), 0.0)) == [("c1", 1)]
    assert b.next_deadline() == 60.0  # only the ttl: the send has not left
    assert b.tick(30.0) == []  # still queued in the shell: never resent
    assert b.written("c1", 1, 31.0)
    assert b.next_deadline() == 34.0
    assert not b.written("c1", 1, 32.0)  # a second report of the same write changes nothing
    assert b.tick(33.9) == []
    (s,) = b.tick(34.0)
    assert sent([s]) == [("c1", 2)]
    assert not b.written("c1", 1, 34.5)  # a stale report (send 1) for send 2
    assert b.written("c1", 2, 35.0)
    effects = b.on_ack(BoardAck("c1", AckStatus.ACCEPTED), 35.5)
    assert effects is not None
    (d,) = effects
    assert isinstance(d, Done)
    assert d.outcome.ack_latency_s == pytest.approx(4.5)  # from the first write


def test_written_for_a_command_not_in_flight_is_ignored() -> None:
    b = confirmed_box(window=1)
    b.submit(env("c1"), 0.0)
    b.submit(env("c2"), 0.0)
    assert not b.written("c2", 1, 1.0)  # queued behind c1, not sent
    assert not b.written("nope", 1, 1.0)
    b.on_ack(BoardAck("c1", AckStatus.ACCEPTED), 2.0)
    assert not b.written("c1", 1, 2.0)  # acked before its write was reported
