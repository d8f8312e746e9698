"""Control message parsing/building and the OTA request rules (pure functions)."""

from __future__ import annotations

import json

import pytest

from gateway.settings import Settings
from gateway.xiaozhi import messages
from gateway.xiaozhi.messages import ControlError, DeviceGoodbye, DeviceHello, DeviceMcp, Listen
from gateway.xiaozhi.ota.wire import (
    ActivateBody,
    OtaRefused,
    activate_body,
    activation_response,
    board_name,
    check_body,
    client_uuid,
    device_id_from_mac,
    mqtt_endpoint,
    ota_response,
    serial_number,
)

FIRMWARE_HELLO = (
    b'{"type":"hello","version":3,"transport":"udp","features":{"aec":true,"mcp":true,'
    b'"glyph_push":false},"audio_params":{"format":"opus","sample_rate":16000,"channels":1,'
    b'"frame_duration":60}}'
)


def test_firmware_hello_parses() -> None:
    msg = messages.parse_device_message(FIRMWARE_HELLO)
    assert isinstance(msg, DeviceHello)
    assert msg.audio_params.frame_duration == 60
    assert msg.features.mcp is True


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b'{"session_id":"s","type":"listen","state":"start","mode":"auto"}', Listen),
        (
            b'{"session_id":"s","type":"listen","state":"detect","text":"\xe4\xbd\xa0\xe5\xa5\xbd"}',
            Listen,
        ),
        (
            b'{"session_id":"","type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":{}}}',
            DeviceMcp,
        ),
        (b'{"session_id":"s","type":"goodbye"}', DeviceGoodbye),
    ],
)
def test_device_messages_parse(payload: bytes, expected: type) -> None:
    assert isinstance(messages.parse_device_message(payload), expected)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"{nope", "malformed_json"),
        (b"\xff\xfe", "malformed_json"),
        (b"[1,2]", "not_object"),
        (b'{"state":"start"}', "invalid"),
        (b'{"type":7}', "unknown_type"),
        (b'{"type":"dance"}', "unknown_type"),
        (
            b'{"type":"hello","version":2,"transport":"udp","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}',
            "unsupported_version",
        ),
        (
            b'{"type":"hello","version":3,"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}',
            "unsupported_transport",
        ),
        (b'{"type":"hello","version":3,"transport":"udp"}', "invalid"),  # no audio_params
        (b'{"type":"listen","state":"sing"}', "invalid"),
        (b'{"type":"listen","state":"start","session_id":5}', "invalid"),
        (b'{"type":"mcp","payload":"x"}', "invalid"),
        (
            b'{"type":"hello","version":3,"transport":"udp","audio_params":{"sample_rate":"x"}}',
            "invalid",
        ),
        (b"[" * 5000 + b"]" * 5000, "oversize"),
        (b"[" * 4000 + b"]" * 4000, "too_deep"),  # refused before the decoder recurses
        (b'{"type":"abort","session_id":"\\ud800"}', "invalid_unicode"),  # a lone surrogate
        (b" " * 9000, "oversize"),
    ],
)
def test_bad_payloads_raise_control_error(payload: bytes, reason: str) -> None:
    with pytest.raises(ControlError) as info:
        messages.parse_device_message(payload)
    assert info.value.reason == reason


def test_outbound_shapes() -> None:
    reply = json.loads(
        messages.hello_reply(
            session_id="sid", server="127.0.0.1", port=8884, key=b"\x01" * 16, nonce=b"\x02" * 16
        )
    )
    assert list(reply) == ["type", "version", "session_id", "transport", "udp", "audio_params"]
    assert reply["udp"] == {
        "server": "127.0.0.1",
        "port": 8884,
        "encryption": "aes-128-ctr",
        "key": "01" * 16,
        "nonce": "02" * 16,
    }
    assert reply["audio_params"] == {
        "format": "opus",
        "sample_rate": 16000,
        "channels": 1,
        "frame_duration": 60,
    }
    assert json.loads(messages.goodbye("sid")) == {"type": "goodbye", "session_id": "sid"}
    assert json.loads(messages.goodbye(None)) == {"type": "goodbye", "session_id": ""}
    assert json.loads(messages.tts("s", "sentence_start", "hi"))["text"] == "hi"
    assert "text" not in json.loads(messages.tts("s", "start"))
    assert json.loads(messages.stt("s", "你好")) == {
        "type": "stt",
        "text": "你好",
        "session_id": "s",
    }


@pytest.mark.parametrize(
    ("mac", "dev"),
    [
        ("24:0a:c4:12:34:56", "24_0a_c4_12_34_56"),
        ("24:0A:C4:12:34:56", "24_0a_c4_12_34_56"),
        ("24-0a-c4-12-34-56", "24_0a_c4_12_34_56"),
    ],
)
def test_device_id_from_mac(mac: str, dev: str) -> None:
    assert device_id_from_mac(mac) == dev


@pytest.mark.parametrize(
    ("mac", "message"),
    [
        (None, "missing"),
        ("", "missing"),
        ("24:0a:c4:12:34", "malformed"),
        ("24:0a-c4:12:34:56", "malformed"),
        ("240ac4123456", "malformed"),
        ("24:0a:c4:12:34:5g", "malformed"),
        ("../../etc/passwd", "malformed"),
        ("ff:ff:ff:ff:ff:ff", "unknown"),
        ("01:00:5e:00:00:01", "unknown"),
        ("00:00:00:00:00:00", "unknown"),
    ],
)
def test_bad_macs_refused(mac: str | None, message: str) -> None:
    with pytest.raises(OtaRefused, match=message):
        device_id_from_mac(mac)


@pytest.mark.parametrize(
    ("agent", "board"),
    [
        ("bread-compact-wifi/2.4.2", "bread-compact-wifi"),
        ("ESP32 S3 Box:v2/1.0", "ESP32_S3_Box_v2"),
        ("", "unknown"),
        (None, "unknown"),
        ("a@@@b/1", "a___b"),
        ("x" * 200, "x" * 64),
    ],
)
def test_board_name(agent: str | None, board: str) -> None:
    assert board_name(agent) == board


def test_client_uuid() -> None:
    assert client_uuid(" 3F2504E0-4F89-41D3-9A0C-0305E82C3301 ") == (
        "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
    )
    for bad in (None, "", "not-a-uuid"):
        with pytest.raises(OtaRefused):
            client_uuid(bad)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"  ",
        b'{"mac_address":"24:0a:c4:12:34:56","chip_model_name":"esp32s3"}',
        b'{"board":{"type":"x","mac":"24:0A:C4:12:34:56"}}',
        b'{"application":{"version":"1.0"}}',
    ],
)
def test_body_matching_header_is_accepted(body: bytes) -> None:
    check_body(body, "24_0a_c4_12_34_56")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"mac_address":"24:0a:c4:99:99:99"}', "does not match"),
        (b'{"board":{"mac":"24:0a:c4:99:99:99"}}', "does not match"),
        (b'{"mac":5}', "does not match"),
        (b'{"mac_address":"garbage"}', "does not match"),
        (b"[1]", "JSON object"),
        (b"{oops", "not JSON"),
        (b"[" * 1000 + b"]" * 1000, "body refused: too_deep"),
        (b'{"mac_address":"\\ud800"}', "body refused: invalid_unicode"),
    ],
)
def test_body_naming_another_device_is_refused(body: bytes, message: str) -> None:
    with pytest.raises(OtaRefused, match=message):
        check_body(body, "24_0a_c4_12_34_56")


def test_ota_response_shape() -> None:
    settings = Settings(mqtt={"url": "mqtt://broker.example:1884"})
    body = ota_response(
        settings=settings,
        endpoint=mqtt_endpoint(settings),
        dev="24_0a_c4_12_34_56",
        board="bread",
        uuid_text="u-u-i-d",
        password="pw",
        now_ms=1,
    )
    assert body["mqtt"] == {
        "endpoint": "broker.example:1884",
        "client_id": "GID_bread@@@24_0a_c4_12_34_56@@@u-u-i-d",
        "username": "24_0a_c4_12_34_56",
        "password": "pw",
        "publish_topic": "device-server/24_0a_c4_12_34_56",
        "subscribe_topic": "devices/p2p/24_0a_c4_12_34_56",
        "keepalive": 240,
    }
    assert set(body) == {"mqtt", "server_time", "firmware"}  # no "activation"
    assert body["server_time"]["timestamp"] == 1
    assert mqtt_endpoint(Settings(xiaozhi={"ota_mqtt_endpoint": "mqtt.example:1883"})) == (
        "mqtt.example:1883"
    )


def test_ota_endpoint_is_the_device_listener_when_the_config_has_one() -> None:
    url = {"url": "mqtt://broker.lan:1883"}
    assert mqtt_endpoint(Settings(mqtt=url)) == "broker.lan:1883"
    assert mqtt_endpoint(Settings(mqtt=url), 1884) == "broker.lan:1884"
    explicit = {"ota_mqtt_endpoint": "boards.example:8883"}
    assert mqtt_endpoint(Settings(mqtt=url, xiaozhi=explicit), 1884) == "boards.example:8883"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"", ActivateBody()),
        (b"{}", ActivateBody()),
        (
            b'{"algorithm":"hmac-sha256","serial_number":"SN1","challenge":"c","hmac":"ab"}',
            ActivateBody("SN1", "c", "ab"),
        ),
        (  # py-xiaozhi wraps the same fields in "Payload"
            b'{"Payload":{"serial_number":"SN1","challenge":"c","hmac":"ab"}}',
            ActivateBody("SN1", "c", "ab"),
        ),
        (b'{"serial_number": 5, "challenge": "", "hmac": "' + b"a" * 129 + b'"}', ActivateBody()),
    ],
)
def test_activate_bodies(body: bytes, expected: ActivateBody) -> None:
    assert activate_body(body) == expected


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "not JSON"),
        (b"[1]", "JSON object"),
        (b"[" * 1000 + b"]" * 1000, "body refused: too_deep"),
        (b'{"Payload":{"serial_number":"\\udfff"}}', "body refused: invalid_unicode"),
    ],
)
def test_bad_activate_bodies_are_refused(body: bytes, message: str) -> None:
    with pytest.raises(OtaRefused, match=message):
        activate_body(body)


@pytest.mark.parametrize(
    ("header", "serial"),
    [(None, None), ("", None), (" SN-0001 ", "SN-0001"), ("has space", None), ("x" * 65, None)],
)
def test_serial_number_header(header: str | None, serial: str | None) -> None:
    assert serial_number(header) == serial


def test_activation_response_shows_the_code_and_carries_no_mqtt() -> None:
    body = activation_response(
        code="123456",
        challenge="c1",
        message="Say 123456",
        timeout_ms=30_000,
        now_ms=1_764_460_800_123,
        firmware="1.0.0",
    )
    assert body["activation"] == {
        "message": "Say 123456",
        "code": "123456",
        "challenge": "c1",
        "timeout_ms": 30_000,
    }
    assert body["server_time"]["timestamp"] == 1_764_460_800_123
    assert body["firmware"] == {"version": "1.0.0", "url": ""}
    assert "mqtt" not in body
