"""Committed AES-128-CTR vectors, checked against the openssl command-line tool.

A bug that is symmetric in our encrypt and decrypt (wrong counter layout, wrong increment) would
survive a round trip; it cannot survive comparison with OpenSSL's ``aes-128-ctr``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from codec.packet import Header, aes_key, seal
from codec.udp import Accepted, UplinkReceiver, UplinkSender, nonce_for

VECTORS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parents[2] / "fixtures" / "udp_vectors.json").read_text()
)["vectors"]


def openssl_ctr(key: bytes, iv: bytes, data: bytes) -> bytes:
    return subprocess.run(
        ["openssl", "enc", "-aes-128-ctr", "-K", key.hex(), "-iv", iv.hex(), "-nopad"],
        input=data,
        capture_output=True,
        check=True,
    ).stdout


def _ids(v: dict[str, Any]) -> str:
    return str(v["name"])


def test_vector_file_covers_the_hard_cases() -> None:
    names = {v["name"] for v in VECTORS}
    assert {"carry_into_timestamp", "carry_into_ssrc", "carry_into_payload_len"} <= names
    assert max(v["payload_len"] for v in VECTORS) == 1484
    assert any(v["payload_len"] > 64 for v in VECTORS)  # several blocks


@pytest.mark.parametrize("v", VECTORS, ids=_ids)
def test_codec_seal_matches_openssl(v: dict[str, Any]) -> None:
    key, plaintext = bytes.fromhex(v["key"]), bytes.fromhex(v["plaintext"])
    header = Header(
        ssrc=v["ssrc"],
        timestamp=v["timestamp"],
        sequence=v["sequence"],
        payload_len=v["payload_len"],
        flags=v["flags"],
        type=v["type"],
    )
    ours = seal(aes_key(key), header, plaintext)
    theirs = openssl_ctr(key, header.pack(), plaintext)
    assert ours.hex() == v["datagram"]
    assert ours[16:] == theirs == bytes.fromhex(v["ciphertext"])


@pytest.mark.parametrize("v", VECTORS, ids=_ids)
def test_receiver_decrypts_vector(v: dict[str, Any]) -> None:
    receiver = UplinkReceiver(key=bytes.fromhex(v["key"]), ssrc=v["ssrc"], flags=v["flags"])
    receiver.last_seq = v["sequence"] - 1
    result = receiver.accept(bytes.fromhex(v["datagram"]))
    assert result == Accepted(bytes.fromhex(v["plaintext"]), v["sequence"], v["timestamp"], 0)
    assert nonce_for(v["ssrc"]).hex() == v["nonce"]


def test_sender_first_datagram_matches_openssl() -> None:
    key = bytes(range(16))
    sender = UplinkSender(key=key, ssrc=0xCAFEBABE)
    payload = b"\xfc" + bytes(range(99))
    datagram = sender.seal(payload, 4242)
    assert isinstance(datagram, bytes)
    header = bytes.fromhex("01000064cafebabe0000109200000001")
    assert datagram[:16] == header
    assert datagram[16:] == openssl_ctr(key, header, payload)
