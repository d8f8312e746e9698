"""The edge mapping: topics models → the channel's frozen dataclasses."""

from __future__ import annotations

import pytest

from gateway.board import wire
from gateway.board.model import (
    AckStatus,
    BoardAck,
    BoardCueDone,
    BoardHeartbeat,
    BoardReport,
    OnlineStatus,
)
from topics.errors import PayloadError, PayloadReason
from topics.snlp_commands import PlayMedia
from topics.tree import TopicKind


@pytest.mark.parametrize(
    ("kind", "payload", "expected"),
    [
        (
            TopicKind.ACK,
            b'{"v":1,"ref":"c1","cmd":"SOUND","status":"busy","code":409}',
            BoardAck("c1", AckStatus.BUSY, "SOUND", "409"),
        ),
        (
            TopicKind.RPT,
            b'{"ref":"c2","stage":"progress","bytes":1,"total":4}',
            BoardReport("c2", None, "progress", bytes=1, total=4),
        ),
        (TopicKind.HB, b'{"v":1,"up_ms":42,"rssi":-60}', BoardHeartbeat(up_ms=42, rssi=-60)),
        (
            TopicKind.HB,
            b'{"v":1,"heap":9000,"sd_free_mb":12.5,"fw":"' + b"x" * 100 + b'"}',
            BoardHeartbeat(heap=9000, sd_free_mb=12.5, fw="x" * 64),  # fw cut to FW_MAX
        ),
        (TopicKind.STATUS, b'{"online":false,"session":"b1"}', OnlineStatus(False, False, "b1")),
        (TopicKind.STATUS, b'{"online":true,"by":"gateway"}', OnlineStatus(True, True, None)),
    ],
)
def test_parse_maps_to_inside_types(kind: TopicKind, payload: bytes, expected: object) -> None:
    assert wire.parse(kind, payload, max_bytes=8192) == expected


def test_a_command_on_a_board_topic_is_refused() -> None:
    envelope = wire.build_command(PlayMedia(name="a"), id="c1", ts_ms=1, prio=2, ttl_ms=10)
    with pytest.raises(PayloadError) as err:
        wire.parse(TopicKind.CMD, envelope.payload, max_bytes=8192)
    assert err.value.reason is PayloadReason.UNKNOWN_TYPE


def test_oversize_payload_is_refused() -> None:
    with pytest.raises(PayloadError) as err:
        wire.parse(TopicKind.HB, b'{"v":1}' + b" " * 100, max_bytes=64)
    assert err.value.reason is PayloadReason.OVERSIZE


def test_command_bytes_are_stable_for_resends() -> None:
    a = wire.build_command(PlayMedia(name="a"), id="c1", ts_ms=1, prio=2, ttl_ms=10)
    b = wire.build_command_from_mapping(
        "PLAY_MEDIA", {"name": "a"}, id="c1", ts_ms=1, prio=2, ttl_ms=10
    )
    assert a == b


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (
            b'{"ref":"c7","evt":"sound.completed","data":{"type":"ding"}}',
            BoardCueDone("sound.completed", "ding"),
        ),
        (
            b'{"ref":"c8","evt":"wait.elapsed","data":{"ms":800}}',
            BoardCueDone("wait.elapsed", ms=800),
        ),
        (b'{"evt":"wait.cancelled"}', BoardCueDone("wait.cancelled")),
    ],
)
def test_cue_answers_map_to_their_own_type(payload: bytes, expected: BoardCueDone) -> None:
    parsed = wire.parse(TopicKind.EVT, payload, max_bytes=8192)
    assert isinstance(parsed, wire.ParsedEvent)
    assert parsed.body == expected
