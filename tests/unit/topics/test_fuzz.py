"""Arbitrary bytes into every parse function raise only `WireError` subclasses."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from functools import partial

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topics import (
    ServerHello,
    TopicKind,
    UdpParams,
    WireError,
    encode_xiaozhi,
    firmware_accepts_hello,
    parse_board_message,
    parse_command,
    parse_ctl_request,
    parse_snlpgw,
    parse_topic,
    parse_xiaozhi,
    parse_xiaozhi_downlink,
    parse_xiaozhi_topic,
)
from topics.backend import SNLPGW_KINDS
from topics.snlp import BOARD_KINDS

PARSERS: dict[str, Callable[[bytes], object]] = {
    "command": parse_command,
    "xiaozhi": parse_xiaozhi,
    "xiaozhi_downlink": parse_xiaozhi_downlink,
    "ctl": parse_ctl_request,
    **{f"board.{k}": partial(parse_board_message, k) for k in BOARD_KINDS},
    **{f"snlpgw.{k}": partial(parse_snlpgw, k) for k in SNLPGW_KINDS},
}

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
_keys = st.sampled_from(
    ["v", "id", "ts", "cmd", "params", "evt", "data", "ref", "status", "type", "stage", "ok",
     "session_id", "payload", "action", "event", "device", "metrics", "online", "udp", "name"]
)  # fmt: skip
_objects = st.dictionaries(_keys | st.text(max_size=8), _json_values, max_size=8).map(
    lambda d: json.dumps(d).encode()
)
_legacy = st.builds(
    lambda verb, value: f"[skill_event]{verb}|{value}".encode(),
    st.sampled_from(["completed", "stopped", "failed", "started", "x"]) | st.text(max_size=8),
    st.text(max_size=12),
)
_oversize = st.binary(max_size=16).map(lambda b: b"{" + b" " * 8190 + b)
_payloads = st.binary(max_size=512) | _objects | _legacy | _oversize


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=_payloads)
def test_parsers_raise_only_wire_errors(payload: bytes) -> None:
    for parse in PARSERS.values():
        with contextlib.suppress(WireError):
            parse(payload)


@settings(max_examples=500, deadline=None)
@given(topic=st.text(max_size=80) | st.lists(st.text(max_size=20), max_size=6).map("/".join))
def test_topic_parsers_raise_only_wire_errors(topic: str) -> None:
    for parse in (parse_topic, partial(parse_xiaozhi_topic, "device-server/{dev}")):
        with contextlib.suppress(WireError):
            parse(topic)


def test_every_topic_kind_with_payloads_is_fuzzed() -> None:
    assert set(BOARD_KINDS) | set(SNLPGW_KINDS) == set(TopicKind)
    assert TopicKind.EVT in BOARD_KINDS


@settings(max_examples=200, deadline=None)
@given(
    session_id=st.text(min_size=1, max_size=64),
    server=st.from_regex(r"[a-z0-9.-]{1,40}", fullmatch=True),
    port=st.integers(1, 65535),
    key=st.binary(min_size=16, max_size=16),
    ssrc=st.binary(min_size=4, max_size=4),
)
def test_every_valid_server_hello_is_accepted_by_the_firmware(
    session_id: str, server: str, port: int, key: bytes, ssrc: bytes
) -> None:
    nonce = b"\x01\x00\x00\x00" + ssrc + bytes(8)
    hello = ServerHello(
        session_id=session_id,
        udp=UdpParams(server=server, port=port, key=key.hex(), nonce=nonce.hex()),
    )
    assert firmware_accepts_hello(json.loads(encode_xiaozhi(hello)))
