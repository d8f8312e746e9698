"""BoardChannel under scale-out: a gateway that does not own a board tracks its presence only
(no outputs, no events, no acks handled); ownership moving away ends its pending commands."""

from __future__ import annotations

from gateway.board.model import OutcomeKind
from tests.unit.board.fakes import DEV, make_rig
from topics.snlp_commands import PlayMedia


async def test_a_board_owned_elsewhere_is_tracked_but_never_acted_for() -> None:
    rig = make_rig(owns=lambda dev: dev != DEV)
    rig.hb()
    assert rig.channel.is_online(DEV)  # presence known: a handover needs it at once
    assert [c.online for c in rig.sink.changes] == [True]  # the runtime hears it too
    assert rig.pub.sent == []  # no status, no presence event: the owner writes those
    rig.deliver(DEV, "evt", {"evt": "button", "data": {"press": "double", "key": "play"}})
    rig.ack("whatever")
    assert rig.sink.events == []
    assert rig.metric('board_inbound_dropped_total{kind="evt",reason="not_owner"}') == 1
    assert rig.metric('board_inbound_dropped_total{kind="ack",reason="not_owner"}') == 1
    assert rig.metric('board_unmatched_total{kind="ack"}') == 0


async def test_losing_ownership_ends_pending_commands_with_no_resend() -> None:
    owned = {DEV}
    rig = make_rig(owns=lambda dev: dev in owned)
    rig.hb()
    future = rig.channel.send(DEV, PlayMedia(name="a.mp3"))
    assert len(rig.commands()) == 1
    owned.clear()  # ownership moved to another gateway
    rig.channel.release_unowned()
    assert future.result().kind is OutcomeKind.CANCELLED
    rig.advance(60.0)  # well past every resend deadline
    assert len(rig.commands()) == 1


async def test_another_gateways_board_is_not_parsed_but_stays_online() -> None:
    """The payload of a board owned elsewhere is the owner's to read: not parsed here (so not
    refused for its content either), yet its traffic keeps its presence alive."""
    owned: set[str] = set()
    rig = make_rig(owns=lambda dev: dev in owned, heartbeat_s=1.0, missed_heartbeats=3)
    rig.hb()
    for _ in range(5):  # 5 s of evts and no heartbeat: 3 missed beats would be offline
        rig.advance(1.0)
        rig.deliver(DEV, "evt", b"{not json")
    assert rig.channel.is_online(DEV)
    assert rig.metric('board_inbound_dropped_total{kind="evt",reason="not_owner"}') == 5
    assert rig.metric('board_inbound_dropped_total{kind="evt",reason="malformed_json"}') == 0
    owned.add(DEV)  # its own board: the same payload is read and refused
    rig.deliver(DEV, "evt", b"{not json")
    assert rig.metric('board_inbound_dropped_total{kind="evt",reason="malformed_json"}') == 1
