"""The simulator's UDP packet code (written separately from ``codec/``, the firmware's way:
overwrite fields of the server nonce) against codec's committed OpenSSL-checked vectors, and
both implementations against each other in both directions. Also the firmware hello-reply
validation mirror."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from codec.udp import DownlinkSender, UplinkReceiver, new_session_crypto
from gateway.simulators.xiaozhi import DeviceUdpCrypto, hello_json, parse_server_hello
from gateway.xiaozhi import messages

VECTORS = json.loads(
    (Path(__file__).parents[2] / "fixtures" / "udp_vectors.json").read_text(encoding="utf-8")
)["vectors"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_simulator_packets_match_committed_vectors(vector: dict[str, Any]) -> None:
    nonce = bytearray.fromhex(vector["nonce"])
    nonce[1] = vector["flags"]  # the device copies type, flags and ssrc from the nonce
    crypto = DeviceUdpCrypto(key=bytes.fromhex(vector["key"]), nonce=bytes(nonce))
    crypto.local_sequence = vector["sequence"] - 1
    datagram = crypto.seal(bytes.fromhex(vector["plaintext"]), vector["timestamp"])
    assert datagram.hex() == vector["datagram"]
    receiver = DeviceUdpCrypto(key=crypto.key, nonce=crypto.nonce)
    assert receiver.open(bytes.fromhex(vector["datagram"])) == bytes.fromhex(vector["plaintext"])


def test_both_implementations_interoperate_both_ways() -> None:
    session = new_session_crypto()
    device = DeviceUdpCrypto(key=session.key, nonce=session.nonce)
    gateway_rx = UplinkReceiver(key=session.key, ssrc=session.ssrc)
    gateway_tx = DownlinkSender(key=session.key, ssrc=session.ssrc)
    for size in (0, 1, 15, 16, 17, 160, 1484):
        opus = secrets.token_bytes(size)
        accepted = gateway_rx.accept(device.seal(opus))
        assert getattr(accepted, "opus_payload", None) == opus
        down = gateway_tx.seal(opus)
        assert isinstance(down, bytes)
        assert device.open(down) == opus
    assert device.local_sequence == device.remote_sequence == 7


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: d[:15], "framing"),
        (lambda d: b"\x02" + d[1:], "framing"),
        (lambda d: d + b"x", "length"),
        (lambda d: d[:-1], "length"),
    ],
)
def test_device_receive_rules(mutate: Any, reason: str) -> None:
    session = new_session_crypto()
    device = DeviceUdpCrypto(key=session.key, nonce=session.nonce)
    datagram = DownlinkSender(key=session.key, ssrc=session.ssrc).seal(b"abc")
    assert isinstance(datagram, bytes)
    assert device.open(mutate(datagram)) is None
    assert device.drops == {reason: 1}


def test_device_drops_duplicates_and_sequence_zero() -> None:
    session = new_session_crypto()
    device = DeviceUdpCrypto(key=session.key, nonce=session.nonce)
    zero = DeviceUdpCrypto(key=session.key, nonce=session.nonce, local_sequence=-1).seal(b"z")
    assert device.open(zero) is None  # seq 0: firmware v2.4 drops it (last starts at 0)
    first = DownlinkSender(key=session.key, ssrc=session.ssrc).seal(b"a")
    assert isinstance(first, bytes)
    assert device.open(first) == b"a"
    assert device.open(first) is None
    assert device.drops == {"old_or_duplicate": 2}


def test_gateway_hello_reply_passes_firmware_validation() -> None:
    reply = json.loads(
        messages.hello_reply(
            session_id="s1",
            server="gw.example",
            port=8884,
            key=bytes(16),
            nonce=b"\x01" + bytes(15),
        )
    )
    hello = parse_server_hello(reply)
    assert hello is not None
    assert (hello.session_id, hello.server, hello.port) == ("s1", "gw.example", 8884)
    assert (hello.sample_rate, hello.frame_duration) == (16000, 60)


@pytest.mark.parametrize(
    "patch",
    [
        {"transport": "websocket"},
        {"udp": None},
        {"udp": {"server": 5, "port": 1, "key": "00" * 16, "nonce": "00" * 16}},
        {"udp": {"server": "h", "port": 0, "key": "00" * 16, "nonce": "00" * 16}},
        {"udp": {"server": "h", "port": 70000, "key": "00" * 16, "nonce": "00" * 16}},
        {"udp": {"server": "h", "port": True, "key": "00" * 16, "nonce": "00" * 16}},
        {"udp": {"server": "h", "port": 1, "key": "00" * 15, "nonce": "00" * 16}},
        {"udp": {"server": "h", "port": 1, "key": "00" * 16, "nonce": "zz" * 16}},
    ],
)
def test_firmware_ignores_broken_replies(patch: dict[str, Any]) -> None:
    reply = {
        "type": "hello",
        "transport": "udp",
        "session_id": "s",
        "udp": {"server": "h", "port": 1, "key": "AA" * 16, "nonce": "00" * 16},
    }
    assert parse_server_hello(reply) is not None  # upper-case hex is fine for the firmware
    assert parse_server_hello({**reply, **patch}) is None


def test_simulator_hello_is_the_firmware_shape() -> None:
    body = json.loads(hello_json())
    assert list(body) == ["type", "version", "transport", "features", "audio_params"]
    assert body["features"] == {"mcp": True, "glyph_push": False}
    assert next(iter(json.loads(hello_json(aec=True))["features"])) == "aec"
    assert isinstance(messages.parse_device_message(hello_json()), messages.DeviceHello)
