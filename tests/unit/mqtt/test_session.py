"""The MQTT 5 session core, table by table: bytes in, bytes and events out, time as an input.

The broker's bytes are built by hand in tests/support/mqtt_bytes.py (from the specification,
not by the client's codec), and what the session writes is read back by the same module."""

from __future__ import annotations

import pytest

from gateway.mqtt import codec
from gateway.mqtt import session as core
from gateway.mqtt.options import ClientOptions
from gateway.mqtt.session import (
    BrokerDisconnect,
    Connected,
    Delivered,
    Failed,
    Failure,
    Invalid,
    InvalidPublish,
    KeepAliveTimeout,
    Loss,
    MqttSession,
    PublishIn,
    Refused,
    SessionError,
    State,
    Subscribed,
    Violation,
)
from tests.support import mqtt_bytes as b

WILL = codec.Will("gw/status", b"offline", qos=1, retain=True)


def session(**options: object) -> MqttSession:
    return MqttSession(ClientOptions(client_id="gw-1", **options))  # type: ignore[arg-type]


def connected(
    s: MqttSession | None = None, now: float = 0.0, props: dict[int, int | str] | None = None
) -> MqttSession:
    s = s or session()
    s.connect(now)
    (event,) = s.receive(b.connack(props=props), now)
    assert isinstance(event, Connected)
    return s


def sent(s: MqttSession) -> list[b.ClientPacket]:
    return b.read_packets(bytearray(s.take_output()))


def one(data: bytes) -> b.ClientPacket:
    (p,) = b.read_packets(bytearray(data))
    return p


# -- CONNECT / CONNACK -----------------------------------------------------------------------


def test_a_clean_session_connects_with_clean_start_and_announces_its_packet_limit() -> None:
    p = one(session(keepalive_s=30).connect(0.0))
    assert p.kind == 1
    assert b.connect_flags(p) & 0x02  # Clean Start
    assert b.connect_keepalive(p) == 30
    assert p.props == {0x27: 1 << 20}  # Maximum Packet Size; no Session Expiry


def test_a_kept_session_connects_without_clean_start_and_with_its_expiry() -> None:
    p = one(session(session_expiry_s=300, receive_maximum=50).connect(0.0))
    assert not b.connect_flags(p) & 0x02
    assert p.props == {0x11: 300, 0x21: 50, 0x27: 1 << 20}


def test_connack_defaults_and_announced_limits() -> None:
    s = connected()
    assert s.state is State.CONNECTED
    assert s.limits == core.Limits(keepalive_s=60)
    s2 = session(keepalive_s=60, will=WILL)
    s2.connect(0.0)
    (event,) = s2.receive(
        b.connack(
            present=True,
            props={
                b.RECEIVE_MAXIMUM: 5,
                b.MAXIMUM_PACKET_SIZE: 2048,
                b.SERVER_KEEPALIVE: 10,
                b.MAXIMUM_QOS: 0,
                b.RETAIN_AVAILABLE: 0,
            },
        ),
        0.0,
    )
    assert event == Connected(core.Limits(5, 2048, 0, False, 10, True), resent=0)


def test_a_refused_connect_is_an_event_and_the_session_may_connect_again() -> None:
    s = session()
    s.connect(0.0)
    assert s.receive(b.connack(0x86, props={b.REASON_STRING: "bad password"}), 0.0) == [
        Refused(0x86, "bad password")
    ]
    assert s.state is State.IDLE
    assert s.connection_lost(Loss.BROKER_CLOSED) == []  # already over
    s.connect(1.0)


def test_a_will_refused_for_its_retain_flag_is_sent_unretained_next_time() -> None:
    s = session(will=WILL)
    first = one(s.connect(0.0))
    assert b.connect_flags(first) & 0x20  # Will Retain
    assert s.receive(b.connack(core.RETAIN_NOT_SUPPORTED), 0.0) == [Refused(0x9A)]
    second = one(s.connect(1.0))
    assert b.connect_flags(second) & 0x04  # a will still
    assert not b.connect_flags(second) & 0x20  # not retained


def test_retain_not_supported_without_a_will_changes_nothing() -> None:
    s = session()
    s.connect(0.0)
    s.receive(b.connack(core.RETAIN_NOT_SUPPORTED), 0.0)
    assert s._will_retain


def test_calls_out_of_state_are_refused() -> None:
    s = session()
    with pytest.raises(SessionError, match="publish in state idle"):
        s.publish("a", b"", 0.0)
    with pytest.raises(SessionError, match="subscribe in state idle"):
        s.subscribe([("a", 1)], 0.0)
    s.connect(0.0)
    with pytest.raises(SessionError, match="connect in state connecting"):
        s.connect(0.0)
    assert s.disconnect() == b""
    assert s.receive(b.publish("a", b"x"), 0.0) == [Violation("PUBLISH before CONNACK")]


def test_a_second_connack_is_a_protocol_error() -> None:
    s = connected()
    assert s.receive(b.connack(), 0.0) == [Violation("CONNACK on an open connection")]


def test_mqtt_311_connects_publishes_and_subscribes_without_properties() -> None:
    s = MqttSession(ClientOptions(client_id="b", version=codec.V311))
    p = one(s.connect(0.0))
    assert p.body[6] == 4
    assert p.props == {}
    s.receive(b"\x20\x02\x00\x00", 0.0)
    assert s.state is State.CONNECTED
    out = s.publish("t", b"x", 0.0, qos=1)
    assert out.packet == codec.publish(b"t", b"x", qos=1, packet_id=1, version=codec.V311)
    _, packet = s.subscribe([("t", 1)], 0.0)
    assert packet == codec.subscribe(2, [("t", 1)], version=codec.V311)


# -- publishing ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("topic", "qos", "reason"),
    [
        ("", 1, Invalid.EMPTY_TOPIC),
        ("a/+/b", 1, Invalid.WILDCARD_TOPIC),
        ("a/#", 1, Invalid.WILDCARD_TOPIC),
        ("a\x00b", 1, Invalid.NUL_IN_TOPIC),
        ("a\ud800", 1, Invalid.NOT_UTF8),
        ("x" * 65_536, 1, Invalid.TOPIC_TOO_LONG),
        ("a", 2, Invalid.QOS_UNSUPPORTED),
    ],
)
def test_what_mqtt_forbids_is_refused_before_a_packet_id_is_taken(
    topic: str, qos: int, reason: Invalid
) -> None:
    s = connected()
    with pytest.raises(InvalidPublish) as err:
        s.publish(topic, b"x", 0.0, qos=qos)
    assert err.value.reason is reason
    assert s.in_flight == 0
    assert s.publish("ok", b"x", 0.0, qos=1).packet_id == 1  # no id was leaked


def test_a_packet_over_the_brokers_maximum_is_refused_and_one_at_it_goes() -> None:
    s = connected(props={b.MAXIMUM_PACKET_SIZE: 100})
    size = codec.publish_size(1, 0, qos=1, properties=0)
    fits = b"x" * (100 - size)
    assert len(s.publish("t", fits, 0.0, qos=1).packet) == 100
    with pytest.raises(InvalidPublish, match="101-byte packet over the broker's 100") as err:
        s.publish("t", fits + b"x", 0.0, qos=1)
    assert err.value.reason is Invalid.TOO_LARGE
    assert s.in_flight == 1


def test_maximum_qos_0_and_no_retain_are_fallbacks_reported_per_publish() -> None:
    s = connected(props={b.MAXIMUM_QOS: 0, b.RETAIN_AVAILABLE: 0})
    out = s.publish("t", b"x", 0.0, qos=1, retain=True)
    assert (out.packet_id, out.qos_downgraded, out.retain_dropped) == (0, True, True)
    p = one(out.packet)
    assert (p.qos, p.retain) == (0, False)
    assert s.in_flight == 0
    plain = s.publish("t", b"x", 0.0)
    assert not plain.qos_downgraded
    assert not plain.retain_dropped


def test_puback_reason_codes_are_outcomes() -> None:
    s = connected()
    for ref in ("a", "b", "c"):
        s.publish(f"t/{ref}", b"x", 0.0, qos=1, ref=ref)
    events = s.receive(b.puback(1) + b.puback(2, 0x10) + b.puback(3, 0x87), 0.0)
    assert events == [Delivered("a"), Delivered("b"), Failed("c", Failure.REFUSED, 0x87, "t/c")]
    assert s.in_flight == 0
    assert s.receive(b.puback(9), 0.0) == []  # not ours: ignored


def test_the_window_is_capped_by_the_brokers_receive_maximum() -> None:
    s = session()
    assert not s.room(10)
    s.connect(0.0)
    s.receive(b.connack(props={b.RECEIVE_MAXIMUM: 2}), 0.0)
    assert s.room(10)
    s.publish("t", b"1", 0.0, qos=1)
    assert s.room(10)
    assert not s.room(1)
    s.publish("t", b"2", 0.0, qos=1)
    assert not s.room(10)


def test_received_messages_and_their_acknowledgement() -> None:
    s = connected()
    events = s.receive(b.publish("a", b"1", qos=1, packet_id=7) + b.publish("b", b"2"), 1.0)
    assert [type(e) for e in events] == [PublishIn, PublishIn]
    first, second = (e.packet for e in events if isinstance(e, PublishIn))
    assert s.acknowledge(first, 1.0) == b.puback(7)
    assert s.acknowledge(second, 1.0) == b""


def test_packet_ids_wrap_and_skip_those_in_use() -> None:
    s = connected()
    s._next_id = 65_534
    assert s.publish("t", b"", 0.0, qos=1).packet_id == 65_535
    assert s.publish("t", b"", 0.0, qos=1).packet_id == 1
    s._next_id = 65_534
    assert s.publish("t", b"", 0.0, qos=1).packet_id == 2  # 65,535 and 1 are in flight


# -- subscribing ---------------------------------------------------------------------------


def test_subscribe_results_name_each_filter_and_refusals() -> None:
    s = session()
    s.connect(0.0)
    s.receive(b.connack(props={b.MAXIMUM_QOS: 0}), 0.0)
    packet_id, packet = s.subscribe([("a/+", 1), ("b/#", 0)], 0.0)
    assert packet == codec.subscribe(packet_id, [("a/+", 0), ("b/#", 0)])  # capped at QoS 0
    (event,) = s.receive(b.suback(packet_id, 0x00, 0x87), 0.0)
    assert event == Subscribed(packet_id, (("a/+", 0), ("b/#", 0x87)))
    assert event.refused == (("b/#", 0x87),)
    assert s.receive(b.suback(99, 0), 0.0) == []  # not asked: ignored


@pytest.mark.parametrize(
    ("filters", "reason"),
    [
        ([], Invalid.BAD_FILTER),
        ([("", 1)], Invalid.EMPTY_TOPIC),
        ([("a/#/b", 1)], Invalid.BAD_FILTER),
        ([("a#", 1)], Invalid.BAD_FILTER),
        ([("a/b+", 1)], Invalid.BAD_FILTER),
        ([("a\x00", 1)], Invalid.NUL_IN_TOPIC),
        ([("a\udc00", 1)], Invalid.NOT_UTF8),
        ([("x" * 65_536, 1)], Invalid.TOPIC_TOO_LONG),
        ([("a", 2)], Invalid.QOS_UNSUPPORTED),
    ],
)
def test_bad_filters_are_refused_before_anything_is_sent(
    filters: list[tuple[str, int]], reason: Invalid
) -> None:
    s = connected()
    with pytest.raises(InvalidPublish) as err:
        s.subscribe(filters, 0.0)
    assert err.value.reason is reason
    assert s._subscribing == {}


# -- the broker ends it --------------------------------------------------------------------


def test_a_broker_disconnect_is_an_event_and_ends_the_read() -> None:
    s = connected()
    events = s.receive(b.disconnect(0x8E, "taken over") + b.publish("a", b"x"), 0.0)
    assert events == [BrokerDisconnect(0x8E, "taken over")]
    assert s.disconnect() == codec.DISCONNECT


def test_in_flight_publishes_are_resent_with_their_ids_and_dup_after_a_local_loss() -> None:
    s = connected()
    for i in range(3):
        s.publish(f"t/{i}", b"x", 0.0, qos=1, ref=i)
    s.receive(b.puback(2), 0.0)
    assert s.connection_lost(Loss.LOCAL) == []
    assert not s.isolating
    s.connect(1.0)
    assert s.take_output() == b""
    (event,) = s.receive(b.connack(present=True), 1.0)
    assert event == Connected(s.limits, resent=2)
    again = sent(s)
    assert [(p.packet_id, p.topic, p.dup) for p in again] == [(1, "t/0", True), (3, "t/2", True)]
    assert s.receive(b.puback(1) + b.puback(3), 1.0) == [Delivered(0), Delivered(2)]


def test_a_loss_before_connack_or_with_nothing_in_flight_blames_nothing() -> None:
    s = session()
    s.connect(0.0)
    assert s.connection_lost(Loss.BROKER_DISCONNECT, 0x90) == []
    s = connected()
    assert s.connection_lost(Loss.BROKER_DISCONNECT, 0x90) == []
    assert not s.isolating


def test_a_publish_alone_in_flight_when_the_broker_blames_a_packet_is_poison() -> None:
    s = connected()
    s.publish("x/y", b"bad", 0.0, qos=1, ref="bad")
    assert s.connection_lost(Loss.BROKER_DISCONNECT, 0x90) == [
        Failed("bad", Failure.POISON, 0x90, "x/y")
    ]
    assert s.in_flight == 0
    assert not s.isolating


def test_suspects_are_resent_one_at_a_time_and_the_guilty_one_is_dropped() -> None:
    s = connected()
    for name in ("ok1", "bad", "ok2"):
        s.publish(f"t/{name}", name.encode(), 0.0, qos=1, ref=name)
    assert s.connection_lost(Loss.BROKER_DISCONNECT, 0x95) == []  # three in flight: who?
    assert s.isolating
    connected(s, 1.0)
    assert [p.topic for p in sent(s)] == ["t/ok1"]  # alone
    assert not s.room(20)  # nothing new while isolating
    assert s.receive(b.puback(1), 1.0) == [Delivered("ok1")]
    assert [p.topic for p in sent(s)] == ["t/bad"]
    assert s.connection_lost(Loss.BROKER_DISCONNECT, 0x95) == [
        Failed("bad", Failure.POISON, 0x95, "t/bad")
    ]
    connected(s, 2.0)
    assert [p.topic for p in sent(s)] == ["t/ok2"]
    assert s.receive(b.puback(2), 2.0) == []  # a PUBACK for an id not sent here: ignored
    assert s.receive(b.puback(3), 2.0) == [Delivered("ok2")]
    assert not s.isolating
    assert s.room(20)


def test_a_broker_that_closes_the_socket_twice_on_the_same_lone_publish_drops_it() -> None:
    s = connected()
    s.publish("t", b"x", 0.0, qos=1, ref="x")
    assert s.connection_lost(Loss.BROKER_CLOSED) == []  # a broker restart closes it once
    connected(s, 1.0)
    assert [p.packet_id for p in sent(s)] == [1]
    assert s.connection_lost(Loss.BROKER_CLOSED) == [Failed("x", Failure.POISON, 0, "t")]


def test_a_disconnect_that_blames_no_packet_leaves_the_lone_publish_in_flight() -> None:
    s = connected()
    s.publish("t", b"x", 0.0, qos=1, ref="x")
    assert s.connection_lost(Loss.BROKER_DISCONNECT, 0x8E) == []  # session taken over
    assert s.isolating
    connected(s, 1.0)
    assert [p.packet_id for p in sent(s)] == [1]
    assert s.connection_lost(Loss.BROKER_DISCONNECT, 0x8E) == []  # never counts
    connected(s, 2.0)
    assert [p.packet_id for p in sent(s)] == [1]
    assert s.receive(b.puback(1), 2.0) == [Delivered("x")]


def test_a_suspect_waiting_for_its_turn_stays_suspect_through_another_loss() -> None:
    s = connected()
    s.publish("t/a", b"a", 0.0, qos=1)
    s.publish("t/b", b"b", 0.0, qos=1)
    s.connection_lost(Loss.BROKER_CLOSED)
    connected(s, 1.0)
    s.take_output()
    assert s.connection_lost(Loss.LOCAL) == []
    assert s._suspects == 2


# -- keep-alive ----------------------------------------------------------------------------


def test_keepalive_pings_after_half_of_it_idle_and_times_out_unanswered() -> None:
    s = session(keepalive_s=60)
    assert s.deadline() is None
    connected(s, 0.0)
    assert s.deadline() == 30.0
    assert s.on_deadline(29.0) == b""
    assert s.on_deadline(30.0) == codec.PINGREQ
    assert s.deadline() == 90.0
    s.receive(b.PINGRESP, 40.0)  # any packet answers it
    assert s.deadline() == 60.0  # half of 60 after the ping was sent at 30
    assert s.on_deadline(60.0) == codec.PINGREQ
    with pytest.raises(KeepAliveTimeout, match=r"in 60\.0s"):
        s.on_deadline(120.0)


def test_the_brokers_server_keep_alive_wins_and_zero_turns_it_off() -> None:
    s = connected(session(keepalive_s=60), props={b.SERVER_KEEPALIVE: 10})
    assert s.limits.keepalive_s == 10
    assert s.deadline() == 5.0
    s.publish("t", b"", 4.0)
    s.receive(b.PINGRESP, 4.5)
    assert s.deadline() == 9.0
    off = connected(session(keepalive_s=60), props={b.SERVER_KEEPALIVE: 0})
    assert off.deadline() is None
    assert off.on_deadline(1_000.0) == b""


def test_a_will_refused_for_its_qos_is_sent_at_qos_0_next_time() -> None:
    s = session(will=WILL)
    assert (b.connect_flags(one(s.connect(0.0))) >> 3) & 3 == 1
    assert s.receive(b.connack(core.QOS_NOT_SUPPORTED), 0.0) == [Refused(0x9B)]
    second = b.connect_flags(one(s.connect(1.0)))
    assert (second >> 3) & 3 == 0  # the will at QoS 0
    assert second & 0x20  # still retained: only its QoS was refused
    s.receive(b.connack(core.RETAIN_NOT_SUPPORTED), 1.0)
    third = b.connect_flags(one(s.connect(2.0)))
    assert (third >> 3) & 3 == 0
    assert not third & 0x20
    bare = session()
    bare.connect(0.0)
    bare.receive(b.connack(core.QOS_NOT_SUPPORTED), 0.0)
    assert not bare._will_qos0


def test_while_isolating_the_suspect_is_blamed_not_a_publish_made_beside_it() -> None:
    s = connected()
    s.publish("t/bad", b"bad", 0.0, qos=1, ref="bad")
    s.publish("t/ok", b"ok", 0.0, qos=1, ref="ok")
    s.connection_lost(Loss.BROKER_DISCONNECT, 0x81)  # two in flight: who?
    connected(s, 1.0)
    assert [p.topic for p in sent(s)] == ["t/bad"]
    s.publish("gw/status", b"online", 1.0, qos=1, ref="presence")  # the connect's, no room()
    assert s.connection_lost(Loss.BROKER_DISCONNECT, 0x81) == [
        Failed("bad", Failure.POISON, 0x81, "t/bad")
    ]
    connected(s, 2.0)  # the presence and t/ok are both suspects now, resent one at a time
    assert [p.topic for p in sent(s)] == ["t/ok"]


def test_any_puback_while_isolating_sends_the_next_suspect() -> None:
    s = connected()
    s.publish("t/a", b"a", 0.0, qos=1, ref="a")
    s.publish("t/b", b"b", 0.0, qos=1, ref="b")
    s.connection_lost(Loss.BROKER_CLOSED)
    connected(s, 1.0)
    assert [p.topic for p in sent(s)] == ["t/a"]
    presence = s.publish("gw/status", b"online", 1.0, qos=1, ref="presence")
    assert s.receive(b.puback(1), 1.0) == [Delivered("a")]
    assert [p.topic for p in sent(s)] == ["t/b"]
    assert s.receive(b.puback(presence.packet_id) + b.puback(2), 1.0) == [
        Delivered("presence"),
        Delivered("b"),
    ]
    assert not s.isolating


def test_checked_topic_names_are_remembered_and_the_memo_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(core, "TOPICS_KEPT", 2)
    s = connected()
    for topic in ("a", "b", "a", "c", "d"):
        s.publish(topic, b"x", 0.0)
    assert len(s._topics) <= 2
    with pytest.raises(InvalidPublish):  # an invalid name is never remembered as valid
        s.publish("a/#", b"x", 0.0)
    with pytest.raises(InvalidPublish):
        s.publish("a/#", b"x", 0.0)


def test_a_resend_not_written_yet_when_the_broker_disconnects_is_not_blamed() -> None:
    s = connected()
    s.publish("t/a", b"a", 0.0, qos=1, ref="a")
    s.publish("t/b", b"b", 0.0, qos=1, ref="b")
    s.connection_lost(Loss.BROKER_CLOSED)
    connected(s, 1.0)
    assert [p.topic for p in sent(s)] == ["t/a"]
    # One read: a's PUBACK (t/b queued for resending) and a DISCONNECT before it is written.
    events = s.receive(b.puback(1) + b.disconnect(0x97), 1.0)
    assert events == [Delivered("a"), BrokerDisconnect(0x97)]
    assert s.take_output() == b""  # the queued resend is gone with the connection ...
    assert s.connection_lost(Loss.BROKER_DISCONNECT, 0x97) == []  # ... and blames nothing
    connected(s, 2.0)
    assert [p.topic for p in sent(s)] == ["t/b"]


def test_any_broker_ending_but_those_about_the_server_counts_toward_poison() -> None:
    for how, reason in ((Loss.BROKER_DISCONNECT, 0x80), (Loss.BROKER_SILENT, 0)):
        s = connected()
        s.publish("t", b"x", 0.0, qos=1, ref="x")
        assert s.connection_lost(how, reason) == []
        connected(s, 1.0)
        sent(s)
        assert s.connection_lost(how, reason) == [Failed("x", Failure.POISON, reason, "t")]
        assert s.settled is False  # not connected


def test_resends_respect_the_receive_maximum_and_new_publishes_wait_for_them() -> None:
    s = connected()
    for i in range(3):
        s.publish(f"t/{i}", b"x", 0.0, qos=1, ref=i)
    s.connection_lost(Loss.LOCAL)
    connected(s, 1.0, props={b.RECEIVE_MAXIMUM: 2})
    assert [p.topic for p in sent(s)] == ["t/0", "t/1"]
    assert not s.room(20)  # t/2 goes before anything new
    assert not s.settled
    assert s.receive(b.puback(1), 1.0) == [Delivered(0)]
    assert [p.topic for p in sent(s)] == ["t/2"]
    assert not s.settled  # two in flight: no room for one more
    s.receive(b.puback(2), 1.0)
    assert s.settled
    assert s.room(20)


def test_what_a_broker_does_not_offer_is_asked_again_of_the_next_one() -> None:
    s = session(will=WILL)
    s.connect(0.0)
    s.receive(b.connack(core.RETAIN_NOT_SUPPORTED), 0.0)
    connected(s, 1.0, props={b.RETAIN_AVAILABLE: 0})
    assert not s.publish("t", b"x", 1.0, retain=True).packet[0] & 0x01
    s.connection_lost(Loss.LOCAL)
    assert not b.connect_flags(one(s.connect(2.0))) & 0x20
    s.receive(b.connack(), 2.0)  # this broker says nothing: retain is available (MQTT 5)
    assert s.publish("t", b"x", 2.0, retain=True).packet[0] & 0x01
    s.connection_lost(Loss.LOCAL)
    assert b.connect_flags(one(s.connect(3.0))) & 0x20  # the will retained again


def test_a_protocol_violation_keeps_the_events_before_it() -> None:
    s = connected()
    s.publish("t", b"x", 0.0, qos=1, ref="x")
    events = s.receive(b.puback(1) + b"\xf0\x00", 0.0)  # then a packet of type 15 (AUTH)
    assert events[0] == Delivered("x")
    assert isinstance(events[1], Violation)
    assert s.in_flight == 0


def test_ping_outstanding_is_cleared_by_any_packet() -> None:
    s = connected(session(keepalive_s=10))
    assert not s.ping_outstanding
    s.on_deadline(5.0)
    assert s.ping_outstanding
    s.receive(b.PINGRESP, 6.0)
    assert not s.ping_outstanding


def test_a_puback_of_a_publish_beside_the_suspect_does_not_send_the_next_one_early() -> None:
    s = connected()
    for name in ("a", "b", "c"):
        s.publish(f"t/{name}", name.encode(), 0.0, qos=1, ref=name)
    s.connection_lost(Loss.BROKER_CLOSED)
    connected(s, 1.0)
    assert [p.topic for p in sent(s)] == ["t/a"]
    beside = s.publish("gw/status", b"online", 1.0, qos=1, ref="presence")  # no room() asked
    assert s.receive(b.puback(beside.packet_id), 1.0) == [Delivered("presence")]
    assert sent(s) == []  # t/a is still alone in flight among the suspects
    s.receive(b.puback(1), 1.0)
    assert [p.topic for p in sent(s)] == ["t/b"]
