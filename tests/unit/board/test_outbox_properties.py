"""Outbox order guarantees under any interleaving of submits, acks, ticks and presence changes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.board.model import AckStatus, BoardAck, Envelope
from gateway.board.outbox import Done, Outbox, OutboxEffect, Send

# (operation, argument): submit (ttl 1 + arg % 20 s), ack (the arg-th submitted command, any
# state), tick (advance arg % 5 s), online (arg odd) / offline (arg even).
ops = st.lists(
    st.tuples(st.sampled_from(["submit", "ack", "tick", "online"]), st.integers(0, 40)),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(window=st.integers(1, 4), resends=st.integers(0, 2), script=ops)
def test_order_and_window_hold_for_any_interleaving(
    window: int, resends: int, script: list[tuple[str, int]]
) -> None:
    b = Outbox(ack_timeout_s=3.0, max_resends=resends, limit=6, window=window)
    now = 0.0
    submitted: list[str] = []
    first_sends: list[str] = []
    ended: list[str] = []

    def apply(effects: list[OutboxEffect] | None) -> None:
        for e in effects or []:
            if isinstance(e, Send):
                assert e.envelope.id not in ended  # nothing is sent after it ended
                if not e.resend:
                    first_sends.append(e.envelope.id)
            else:
                assert isinstance(e, Done)
                assert e.envelope.id not in ended  # every command ends exactly once
                ended.append(e.envelope.id)

    for op, arg in script:
        if op == "submit":
            cid = f"c{len(submitted)}"
            submitted.append(cid)
            apply(b.submit(Envelope(cid, "X", b"{}", ttl_ms=(1 + arg % 20) * 1000), now))
        elif op == "ack" and submitted:
            apply(b.on_ack(BoardAck(submitted[arg % len(submitted)], AckStatus.ACCEPTED), now))
        elif op == "tick":
            now += arg % 5
            apply(b.tick(now))
        elif op == "online":
            apply(b.set_online(arg % 2 == 1, now))
        flying = b.in_flight()
        pending = [c for c in submitted if c not in ended]
        assert len(flying) <= window
        assert list(flying) == pending[: len(flying)]  # the oldest pending ones
        assert flying == () or b.online
        if b.online:  # the window is used whenever there is something to send
            assert len(flying) == min(window, len(pending))
    # First sends happen in submit order (resends may repeat earlier ids, never skip ahead).
    assert first_sends == [c for c in submitted if c in first_sends]
    assert len(b) == len([c for c in submitted if c not in ended])
