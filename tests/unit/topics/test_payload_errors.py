"""Bad payloads raise `PayloadError` with the right reason; legacy text; the firmware hello check."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from topics import (
    AudioEvent,
    PayloadError,
    PayloadReason,
    TopicKind,
    encode,
    firmware_accepts_hello,
    parse_board_message,
    parse_command,
    parse_ctl_request,
    parse_snlpgw,
    parse_xiaozhi,
    parse_xiaozhi_downlink,
)
from topics.errors import excerpt
from topics.wire import MAX_JSON_DEPTH, check_depth, load_json, load_object

from .samples import SAMPLES

R = PayloadReason
Parse = Callable[[bytes], object]
EVT: Parse = partial(parse_board_message, TopicKind.EVT)
ACK: Parse = partial(parse_board_message, TopicKind.ACK)
RPT: Parse = partial(parse_board_message, TopicKind.RPT)
HB: Parse = partial(parse_board_message, TopicKind.HB)
STATUS: Parse = partial(parse_board_message, TopicKind.STATUS)
TASK: Parse = partial(parse_snlpgw, TopicKind.TASK)
REPLY: Parse = partial(parse_snlpgw, TopicKind.REPLY)
ASSESS: Parse = partial(parse_snlpgw, TopicKind.ASSESSMENT)
CMD_OK = b'{"v":1,"id":"c1","ts":1,"prio":3,"ttl_ms":1,'

ALL_PARSERS: list[Parse] = [
    parse_command, EVT, ACK, RPT, HB, STATUS, parse_xiaozhi, parse_xiaozhi_downlink,
    parse_ctl_request, TASK, REPLY, ASSESS,
    *(partial(parse_snlpgw, k) for k in (TopicKind.OPS_METRICS, TopicKind.OPS_EVENTS, TopicKind.GW_STATUS)),
]  # fmt: skip


@pytest.mark.parametrize("parse", ALL_PARSERS)
@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", R.MALFORMED_JSON),
        (b"{", R.MALFORMED_JSON),
        (b'{"a":NaN}', R.MALFORMED_JSON),
        (b"\xff\xfe{}", R.MALFORMED_JSON),
        (b"[" * 4000 + b"]" * 4000, R.TOO_DEEP),  # would be a RecursionError in the decoder
        (b"[" * 4000, R.TOO_DEEP),  # refused before decoding, even unbalanced
        (b'{"a":' * 33 + b"1" + b"}" * 33, R.TOO_DEEP),
        (b'{"a":"\\ud800"}', R.INVALID_UNICODE),  # a lone high surrogate, escaped
        (b'{"\\udfff":1}', R.INVALID_UNICODE),  # a lone low surrogate in a key
        (b'{"a":["\xed\xa0\x80"]}', R.INVALID_UNICODE),  # raw (CESU-8) surrogate bytes
        (b"[]", R.NOT_OBJECT),
        (b'"text"', R.NOT_OBJECT),
        (b"null", R.NOT_OBJECT),
        (b"{" + b" " * 9000 + b"}", R.OVERSIZE),
    ],
)
def test_generic_rejects(parse: Parse, payload: bytes, reason: PayloadReason) -> None:
    with pytest.raises(PayloadError) as info:
        parse(payload)
    assert info.value.reason is reason


@pytest.mark.parametrize(
    ("parse", "payload", "reason", "path"),
    [
        (parse_command, CMD_OK + b'"cmd":"REBOOT","params":{}}', R.UNKNOWN_TYPE, ""),
        (parse_command, CMD_OK + b'"cmd":"PLAY_MEDIA","params":{"name":"a","repeat":0}}', R.INVALID, "repeat"),
        (parse_command, CMD_OK + b'"cmd":"PLAY_MEDIA","params":{"name":"a","volume":"50"}}', R.INVALID, "volume"),
        (parse_command, CMD_OK + b'"cmd":"PLAY_MEDIA","params":{"name":"a","bogus":1}}', R.INVALID, "bogus"),
        (parse_command, CMD_OK + b'"cmd":"WAIT","params":{"ms":true}}', R.INVALID, "ms"),
        (parse_command, b'{"id":"c1","ts":1,"cmd":"WAIT","params":{"ms":1},"prio":3,"ttl_ms":1}', R.UNSUPPORTED_VERSION, "v=None"),
        (parse_command, b'{"v":2,"id":"c1"}', R.UNSUPPORTED_VERSION, "v=2"),
        (ACK, b'{"ref":"c1","status":"ok"}', R.INVALID, "status"),
        (ACK, b'{"status":"accepted"}', R.INVALID, "ref"),
        (ACK, b'{"v":true,"ref":"c1","status":"accepted"}', R.UNSUPPORTED_VERSION, "v=True"),
        (RPT, b'{"ref":"c1","stage":"done"}', R.INVALID, "ok"),
        (RPT, b'{"ref":"c1","stage":"progress","bytes":-1}', R.INVALID, "bytes"),
        (HB, b'{"up_ms":"1"}', R.INVALID, "up_ms"),
        (STATUS, b'{"online":"yes"}', R.INVALID, "online"),
        (EVT, b'{"evt":5}', R.INVALID, "discriminator"),
        (EVT, b'{"evt":"audio.completed","data":{"duration_ms":-5}}', R.INVALID, "duration_ms"),
        (EVT, b'{"evt":"audio.completed","data":{"duration_ms":2.5}}', R.INVALID, "duration_ms"),
        (EVT, b'{"evt":"audio.stopped","data":{"reason":"bored"}}', R.INVALID, "reason"),
        (EVT, b'{"evt":"button","data":{"press":"triple"}}', R.INVALID, "press"),
        (EVT, b'{"evt":"app_task.state","data":{"detail":{}}}', R.INVALID, "state"),
        (EVT, b'{"evt":"sd.full","data":[1]}', R.INVALID, "data"),
        (parse_xiaozhi, b'{"type":"dance"}', R.UNKNOWN_TYPE, "dance"),
        (parse_xiaozhi, b'{"session_id":"s"}', R.INVALID, "type"),
        (parse_xiaozhi, b'{"type":"listen","state":"go"}', R.INVALID, "state"),
        (parse_xiaozhi, b'{"type":"hello","version":"3","transport":"udp","audio_params":{}}', R.INVALID, "version"),
        (parse_xiaozhi, b'{"type":"mcp","payload":{"jsonrpc":"1.0"}}', R.INVALID, "jsonrpc"),
        (parse_xiaozhi, b'{"type":"goodbye","session_id":7}', R.INVALID, "session_id"),
        (parse_xiaozhi_downlink, b'{"type":"mcp","payload":{"jsonrpc":"2.0","id":"1","method":"x"}}', R.INVALID, "id"),
        (parse_xiaozhi_downlink, b'{"type":"system","command":"shutdown"}', R.INVALID, "command"),
        (parse_ctl_request, b'{"v":1,"id":"r1","action":"start","app_id":"a"}', R.INVALID, "task_id"),
        (parse_ctl_request, b'{"v":1,"id":"r1","action":"jump"}', R.INVALID, "action"),
        (parse_ctl_request, b'{"v":1,"id":"r1","action":"stop","priority":4}', R.INVALID, "priority"),
        (parse_ctl_request, b'{"v":1,"id":"r1","action":"stop","prority":3}', R.INVALID, "prority"),
        (parse_ctl_request, b'{"id":"r1","action":"stop"}', R.UNSUPPORTED_VERSION, ""),
        (TASK, b'{"v":1,"ts":1,"device":"aa_bb_cc_dd_ee_ff","event":"step.exploded","data":{}}', R.UNKNOWN_TYPE, "step.exploded"),
        (TASK, b'{"v":1,"ts":1,"device":"AA","event":"step.played","data":{}}', R.INVALID, "device"),
        (REPLY, b'{"v":1,"ref":"r","device":"aa_bb_cc_dd_ee_ff","action":"stop","status":"refused","ts":1}', R.INVALID, "reason"),
        (ASSESS, b'{"v":1,"instance_id":"i","step_index":0,"device":"aa_bb_cc_dd_ee_ff","prompt_text":"p","asr_text":null,"metrics":[],"assessed_at":1}', R.INVALID, "expected_text"),
        (ASSESS, b'{"v":1,"instance_id":"i","step_index":0,"device":"aa_bb_cc_dd_ee_ff","prompt_text":"p","expected_text":null,"asr_text":null,"metrics":[{"method":"m","value":"1"}],"assessed_at":1}', R.INVALID, "metrics.0.value"),
        (ASSESS, b'{"v":1,"instance_id":"i","step_index":0,"device":"aa_bb_cc_dd_ee_ff","prompt_text":"p","expected_text":null,"asr_text":null,"metrics":[],"assessed_at":1,"passed":true}', R.INVALID, "passed"),
    ],
)  # fmt: skip
def test_typed_rejects(parse: Parse, payload: bytes, reason: PayloadReason, path: str) -> None:
    with pytest.raises(PayloadError) as info:
        parse(payload)
    assert info.value.reason is reason
    assert path in info.value.detail


def test_device_messages_ignore_unknown_keys_but_ours_forbid_them() -> None:
    hb = HB(b'{"up_ms":1,"new_firmware_field":{"x":1}}')
    assert b"new_firmware_field" not in encode(hb)  # type: ignore[arg-type]
    hello = parse_xiaozhi(
        b'{"type":"hello","version":3,"transport":"udp","features":{"mcp":true,"future":1},'
        b'"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60,"x":1}}'
    )
    assert hello.type == "hello"
    with pytest.raises(PayloadError, match="extra"):
        parse_xiaozhi_downlink(b'{"type":"stt","text":"x","extra":1}')


@pytest.mark.parametrize(
    "depth", [MAX_JSON_DEPTH - 3, MAX_JSON_DEPTH - 2, MAX_JSON_DEPTH - 1, 100, 900]
)
def test_deep_json_inside_free_form_data(depth: int) -> None:
    nested = b"[" * depth + b"]" * depth
    payload = b'{"evt":"sd.deep","data":{"a":' + nested + b"}}"  # two levels around it
    if depth + 2 > MAX_JSON_DEPTH:
        with pytest.raises(PayloadError) as info:
            EVT(payload)
        assert info.value.reason is R.TOO_DEEP
        assert f"nested deeper than {MAX_JSON_DEPTH} levels" in info.value.detail
    else:
        event = EVT(payload)
        assert event.evt == "sd.deep"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "payload",
    [
        b'{"evt":"sd.x","data":{"t":"' + b"[{" * 100 + b'"}}',  # brackets inside strings
        b'{"evt":"sd.x","data":{"t":"\\"' + b"[" * 20 + b'","u":"' + b"{" * 20 + b'"}}',
        b'{"evt":"sd.x","data":{"a":[' + b"[]," * 60 + b'"x"]}}',  # many, side by side
        b'{"evt":"sd.x","data":{"a":[' + b"[[[]]]," * 30 + b"1]}}",
    ],
)
def test_brackets_that_do_not_nest_are_not_depth(payload: bytes) -> None:
    assert EVT(payload).evt == "sd.x"  # type: ignore[attr-defined]


def test_the_depth_check_works_on_bytes_alone() -> None:
    check_depth(b"]]]]" * 20 + b"[" * MAX_JSON_DEPTH)  # unbalanced, never past the limit
    with pytest.raises(PayloadError, match="too_deep"):  # malformed anyway: any refusal will do
        check_depth(b'"' + b"[" * 50)  # an unterminated string is no string: its brackets count
    with pytest.raises(PayloadError, match="too_deep: nested deeper than 2 levels"):
        check_depth(b"[[[]]]", limit=2)  # three openers in a row
    with pytest.raises(PayloadError, match="too_deep"):
        check_depth(b"[[][[][[]]]]", limit=2)  # no run of three: the running depth shows it
    check_depth(b"[[]]", limit=2)
    check_depth(b"[[][][][]]", limit=2)
    check_depth(b'"' + b"[" * 50 + b'"')  # all inside a string: nothing left to count
    check_depth('["字", "第"]'.encode(), limit=1)  # UTF-8: no bracket inside a character


def test_utf16_and_utf32_payloads_are_measured_as_text() -> None:
    deep = "[" * 40 + "]" * 40
    for codec in ("utf-16-le", "utf-16-be", "utf-32"):
        assert EVT('{"evt":"sd.x","data":{"t":"字"}}'.encode(codec)).evt == "sd.x"  # type: ignore[attr-defined]
        with pytest.raises(PayloadError) as info:
            EVT(('{"evt":"sd.x","data":' + deep + "}").encode(codec))
        assert info.value.reason is R.TOO_DEEP


@pytest.mark.parametrize(
    "payload",
    [
        b'{"evt":"sd.x","data":{"t":"caf\\u00e9","n":[1,2.5,true,null,"\\u4f60"]}}',
        b'{"evt":"sd.x","data":{"t":"\\ud83d\\ude00"}}',  # a surrogate pair: one emoji
        b'{"evt":"sd.x","data":{"t":"\\\\ud800"}}',  # an escaped backslash, then text
        '{"evt":"sd.x","data":{"t":"\U0001f600 \u4f60"}}'.encode(),  # raw UTF-8
    ],
)
def test_escapes_and_raw_text_that_are_unicode_pass(payload: bytes) -> None:
    assert EVT(payload).evt == "sd.x"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "payload",
    [
        b'{"type":"abort","session_id":"\\ud800"}',
        b'{"type":"goodbye","session_id":"s\\udc00x"}',
        b'{"type":"mcp","session_id":"s","payload":{"jsonrpc":"2.0","id":"\\ud800","result":{}}}',
        b'{"type":"mcp","session_id":"s","payload":{"jsonrpc":"2.0","id":1,"result":{"c":["\\ude00"]}}}',
        b'{"type":"abort","session_id":"s","x":{"\\ud83d":1}}',  # an ignored key counts too
        b'{"type":"abort","session_id":"\\ude00\\ud83d"}',  # a pair in the wrong order
    ],
)
def test_lone_surrogates_anywhere_in_a_device_message_are_refused(payload: bytes) -> None:
    with pytest.raises(PayloadError) as info:
        parse_xiaozhi(payload)
    assert info.value.reason is R.INVALID_UNICODE


def test_http_bodies_take_the_same_bounds_without_the_mqtt_cap() -> None:
    big = b'{"a":"' + b"x" * 20_000 + b'"}'
    assert load_json(big, max_bytes=None) == {"a": "x" * 20_000}
    assert load_json(b"[1]", max_bytes=None) == [1]
    for bad, reason in ((b"[" * 1000 + b"]" * 1000, R.TOO_DEEP), (b'"\\ud800"', R.INVALID_UNICODE)):
        with pytest.raises(PayloadError) as info:
            load_json(bad, max_bytes=None)
        assert info.value.reason is reason


def test_error_message_never_carries_the_whole_payload() -> None:
    payload = b'{"type":"listen","state":"' + b"x" * 5000 + b'"}'
    with pytest.raises(PayloadError) as info:
        parse_xiaozhi(payload)
    assert len(str(info.value)) <= 140
    assert len(excerpt(b"\x00" * 1000)) <= 120


def test_wrong_kind_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="not an snlp/v1 board topic"):
        parse_board_message(TopicKind.CTL, b"{}")
    with pytest.raises(ValueError, match="not an snlpgw/v1 topic"):
        parse_snlpgw(TopicKind.EVT, b"{}")


# --- legacy text events -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "evt", "data"),
    [
        (b"[skill_event]completed|2140", "audio.completed", {"duration_ms": 2140, "reason": "eof"}),
        (b"  [skill_event]completed|2140\n", "audio.completed", {"duration_ms": 2140, "reason": "eof"}),
        (b"[skill_event] completed | 2140 \r\n", "audio.completed", {"duration_ms": 2140, "reason": "eof"}),
        (b"[skill_event]stopped|870", "audio.stopped", {"duration_ms": 870, "reason": "stopped"}),
        (b"[skill_event]failed|404", "audio.failed", {"code": 404, "reason": "error"}),
        (b"[skill_event]failed|ENOENT", "audio.failed", {"code": "ENOENT", "reason": "error"}),
        (b"[skill_event]failed", "audio.failed", {"reason": "error"}),
        (b"[skill_event]completed", "audio.completed", {"reason": "eof"}),
        (b"[skill_event]started|0", "audio.started", {"duration_ms": 0}),
    ],
)  # fmt: skip
def test_legacy_text(text: bytes, evt: str, data: dict[str, Any]) -> None:
    event = EVT(text)
    assert isinstance(event, AudioEvent)
    assert event.evt == evt
    assert event.ref is None
    assert event.data.model_dump(exclude_none=True) == data
    structured = json.loads(encode(event))
    assert structured == {"v": 1, "ref": None, "evt": evt, "data": data}
    assert EVT(encode(event)) == event  # the structured form parses to the same model


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (b"[skill_event]completed|abc", R.INVALID),
        (b"[skill_event]completed|-5", R.INVALID),
        (b"[skill_event]completed|1|2", R.INVALID),
        (b"[skill_event]completed|\xff", R.INVALID),
        (b"[skill_event]completed|\xd9\xa3", R.INVALID),  # Arabic-Indic digit three
        (b"[skill_event]exploded|1", R.UNKNOWN_TYPE),
        (b"[skill_event]", R.INVALID),
        (b"[skill_event]completed|" + b"1" * 9000, R.OVERSIZE),
        (b"[app_task]x", R.MALFORMED_JSON),  # not legacy audio text, so parsed as JSON
    ],
)
def test_legacy_text_rejects(text: bytes, reason: PayloadReason) -> None:
    with pytest.raises(PayloadError) as info:
        EVT(text)
    assert info.value.reason is reason


def test_legacy_text_only_on_the_evt_topic() -> None:
    with pytest.raises(PayloadError) as info:
        ACK(b"[skill_event]completed|2140")
    assert info.value.reason is R.MALFORMED_JSON


# --- firmware v2.4 ParseServerHello ---------------------------------------------------------


def _our_hello() -> dict[str, Any]:
    sample = next(s for s in SAMPLES if s.id == "xiaozhi.down.hello")
    hello: dict[str, Any] = json.loads(encode(sample.model))
    return hello


def _broken(path: str, value: Any) -> dict[str, Any]:
    hello = _our_hello()
    *parents, leaf = path.split(".")
    node = hello
    for key in parents:
        node = node[key]
    if value is _DELETE:
        del node[leaf]
    else:
        node[leaf] = value
    return hello


_DELETE = object()


def test_firmware_accepts_our_hello() -> None:
    assert firmware_accepts_hello(_our_hello())
    upper = _broken("udp.key", "0123456789ABCDEF0123456789ABCDEF")
    assert firmware_accepts_hello(upper)  # the firmware decodes hex in either case
    assert firmware_accepts_hello(_broken("version", 1))  # version is ignored
    assert firmware_accepts_hello(_broken("udp.encryption", _DELETE))  # so is encryption
    assert firmware_accepts_hello(_broken("audio_params", _DELETE))  # defaults 24000/60


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("type", "hi"),
        ("transport", "websocket"),
        ("transport", _DELETE),
        ("session_id", 5),
        ("session_id", _DELETE),
        ("udp", "127.0.0.1:8884"),
        ("udp", _DELETE),
        ("udp.server", 127001),
        ("udp.server", _DELETE),
        ("udp.port", 0),
        ("udp.port", 65536),
        ("udp.port", "8884"),
        ("udp.port", True),
        ("udp.port", _DELETE),
        ("udp.key", "0123456789abcdef0123456789abcde"),  # 15.5 bytes
        ("udp.key", "0123456789abcdef0123456789abcdef00"),  # 17 bytes
        ("udp.key", "0123456789abcdef0123456789abcdeg"),  # not hex
        ("udp.key", " 123456789abcdef0123456789abcdef"),
        ("udp.key", 5),
        ("udp.nonce", "01000000deadbeef"),  # 8 bytes
        ("udp.nonce", _DELETE),
    ],
)
def test_firmware_rejects_broken_hello(path: str, value: Any) -> None:
    assert not firmware_accepts_hello(_broken(path, value))


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16-le", "utf-16-be", "utf-32"])
def test_load_object_reads_every_encoding_json_loads_reads(encoding: str) -> None:
    text = '{"ref": "c\\u00e9", "n": [1, 2.5, true, null], "s": "\u4f60\u597d"}'
    payload = text.encode(encoding)
    assert load_object(payload) == json.loads(payload)


@pytest.mark.parametrize("payload", [b'{"a":"\xff"}', b'{"a":Infinity}', b'{"a":-Infinity}'])
def test_load_object_refuses_what_json_loads_with_no_constants_refuses(payload: bytes) -> None:
    with pytest.raises(PayloadError) as info:
        load_object(payload)
    assert info.value.reason is R.MALFORMED_JSON
