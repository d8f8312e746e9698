"""Header fields, rejection reasons, sequence rules and key material (table-driven)."""

from __future__ import annotations

import random
import secrets
import struct

import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from codec.counter_space import DOWNLINK_FLAGS, MAX_DOWNLINK_SEQ, downlink_ssrc
from codec.packet import (
    HEADER_SIZE,
    MAX_DATAGRAM,
    MAX_PAYLOAD,
    DropReason,
    Header,
    aes_key,
    check_header,
    open_payload,
    peek_ssrc,
)
from codec.udp import (
    Accepted,
    DownlinkSender,
    Dropped,
    SessionCrypto,
    UplinkReceiver,
    UplinkSender,
    new_session_crypto,
    nonce_for,
)

KEY = bytes.fromhex("000102030405060708090a0b0c0d0e0f")
SSRC = 0x12345678


def raw(
    *,
    ptype: int = 1,
    flags: int = 0,
    plen: int = 3,
    ssrc: int = SSRC,
    ts: int = 0,
    seq: int = 1,
    body: bytes | None = None,
) -> bytes:
    payload = b"abc" if body is None else body
    return struct.pack(">BBHIII", ptype, flags, plen, ssrc, ts, seq) + payload


@pytest.mark.parametrize(
    ("field", "value", "offset", "encoded"),
    [
        ("ssrc", 0xA1B2C3D4, 4, b"\xa1\xb2\xc3\xd4"),
        ("timestamp", 0x01020304, 8, b"\x01\x02\x03\x04"),
        ("sequence", 0xFFFFFFFE, 12, b"\xff\xff\xff\xfe"),
        ("payload_len", 0x0102, 2, b"\x01\x02"),
        ("flags", 0x7F, 1, b"\x7f"),
    ],
)
def test_header_fields_are_big_endian_at_their_offsets(
    field: str, value: int, offset: int, encoded: bytes
) -> None:
    fields = {"ssrc": 1, "timestamp": 2, "sequence": 3, "payload_len": 0, "flags": 0}
    fields[field] = value
    header = Header(**fields)
    packed = header.pack()
    assert len(packed) == HEADER_SIZE
    assert packed[0] == 1
    assert packed[offset : offset + len(encoded)] == encoded
    datagram = packed + bytes(header.payload_len)
    assert check_header(datagram) == header


@pytest.mark.parametrize(
    ("datagram", "reason"),
    [
        (b"", DropReason.TOO_SHORT),
        (raw()[:15], DropReason.TOO_SHORT),
        (raw(plen=MAX_PAYLOAD + 1, body=bytes(MAX_PAYLOAD + 1)), DropReason.TOO_LARGE),
        (raw(ptype=0), DropReason.BAD_TYPE),
        (raw(ptype=2), DropReason.BAD_TYPE),
        (raw(plen=4), DropReason.LENGTH_MISMATCH),
        (raw(plen=2), DropReason.LENGTH_MISMATCH),
        (raw(plen=0, body=b""), None),
        (raw(plen=MAX_PAYLOAD, body=bytes(MAX_PAYLOAD)), None),
    ],
    ids=[
        "empty",
        "15_bytes",
        "1501_bytes",
        "type_0",
        "type_2",
        "len_short",
        "len_long",
        "empty_payload_ok",
        "1500_bytes_ok",
    ],
)
def test_framing_checks(datagram: bytes, reason: DropReason | None) -> None:
    assert len(datagram) <= MAX_DATAGRAM or reason is DropReason.TOO_LARGE
    assert peek_ssrc(datagram) == (SSRC if reason is None else reason)
    receiver = UplinkReceiver(key=KEY, ssrc=SSRC)
    result = receiver.accept(datagram)
    if reason is None:
        assert isinstance(result, Accepted)
    else:
        assert result == Dropped(reason)
        assert receiver.drops == {reason: 1}
        assert receiver.last_seq == 0


def stream(n: int, key: bytes = KEY, ssrc: int = SSRC) -> list[bytes]:
    sender = UplinkSender(key=key, ssrc=ssrc)
    return [sender.seal(bytes([i % 256]) * (i + 1), 60 * i) for i in range(n)]


def test_round_trip_in_order() -> None:
    receiver = UplinkReceiver(key=KEY, ssrc=SSRC)
    results = [receiver.accept(d) for d in stream(5)]
    assert results == [Accepted(bytes([i]) * (i + 1), i + 1, 60 * i, 0) for i in range(5)]
    assert (receiver.accepted, receiver.lost, receiver.last_seq) == (5, 0, 5)


def test_duplicates_and_old_packets_are_replays() -> None:
    d = stream(4)
    receiver = UplinkReceiver(key=KEY, ssrc=SSRC)
    seen = [receiver.accept(x) for x in (d[0], d[0], d[2], d[1], d[2], d[3])]
    kinds = [r.reason if isinstance(r, Dropped) else r.seq for r in seen]
    assert kinds == [1, DropReason.REPLAY, 3, DropReason.REPLAY, DropReason.REPLAY, 4]
    assert receiver.drops == {DropReason.REPLAY: 3}


def test_gaps_are_reported_as_lost_before() -> None:
    d = stream(10)
    receiver = UplinkReceiver(key=KEY, ssrc=SSRC)
    got = [receiver.accept(d[i]) for i in (2, 3, 7, 9)]
    assert [r.lost_before for r in got if isinstance(r, Accepted)] == [2, 0, 3, 1]
    assert receiver.lost == 6


def test_sequence_zero_is_never_accepted() -> None:
    receiver = UplinkReceiver(key=KEY, ssrc=SSRC)
    assert receiver.accept(raw(seq=0)) == Dropped(DropReason.REPLAY)


def test_wrong_ssrc_is_dropped_before_decryption() -> None:
    receiver = UplinkReceiver(key=KEY, ssrc=SSRC)
    assert receiver.accept(raw(ssrc=SSRC + 1)) == Dropped(DropReason.UNKNOWN_SSRC)
    assert receiver.last_seq == 0


def test_forged_huge_sequence_cannot_lock_out_the_stream() -> None:
    d = stream(3)
    receiver = UplinkReceiver(key=KEY, ssrc=SSRC, max_forward_jump=1000)
    assert isinstance(receiver.accept(d[0]), Accepted)
    assert receiver.accept(raw(seq=0xFFFFFFFF)) == Dropped(DropReason.SEQ_JUMP)
    assert receiver.accept(raw(seq=1 + 1001)) == Dropped(DropReason.SEQ_JUMP)
    assert [receiver.accept(x) for x in d[1:]] == [
        Accepted(b"\x01\x01", 2, 60, 0),
        Accepted(b"\x02\x02\x02", 3, 120, 0),
    ]
    assert receiver.drops == {DropReason.SEQ_JUMP: 2}
    # The largest allowed jump is accepted and reported as loss.
    result = receiver.accept(raw(seq=3 + 1000))
    assert isinstance(result, Accepted)
    assert result.lost_before == 999


def test_payload_decrypts_with_the_header_as_counter() -> None:
    d = stream(2)[1]
    assert open_payload(aes_key(KEY), d) == b"\x01\x01"
    assert open_payload(aes_key(bytes(16)), d) != b"\x01\x01"


def test_downlink_numbers_from_one_in_the_downlink_counter_space() -> None:
    sender = DownlinkSender(key=KEY, ssrc=SSRC)
    first, second = sender.seal(b"x" * 10), sender.seal(b"")
    assert isinstance(first, bytes)
    assert isinstance(second, bytes)
    assert check_header(first) == Header(downlink_ssrc(SSRC), 60, 1, 10, flags=DOWNLINK_FLAGS)
    assert check_header(second) == Header(downlink_ssrc(SSRC), 120, 2, 0, flags=DOWNLINK_FLAGS)
    assert downlink_ssrc(SSRC) == SSRC | 0x8000_0000
    assert sender.sent == 2


def test_downlink_refuses_oversized_payloads_without_consuming_a_sequence() -> None:
    sender = DownlinkSender(key=KEY, ssrc=SSRC)
    assert sender.seal(bytes(MAX_PAYLOAD + 1)) is DropReason.TOO_LARGE
    biggest = sender.seal(bytes(MAX_PAYLOAD))
    assert isinstance(biggest, bytes)
    assert len(biggest) == MAX_DATAGRAM
    assert check_header(biggest) == Header(downlink_ssrc(SSRC), 60, 1, MAX_PAYLOAD, flags=0x80)
    assert sender.drops == {DropReason.TOO_LARGE: 1}


def test_downlink_stops_before_its_counter_could_carry_out_of_the_sequence() -> None:
    sender = DownlinkSender(key=KEY, ssrc=SSRC, last_seq=MAX_DOWNLINK_SEQ - 1)
    last = sender.seal(bytes(MAX_PAYLOAD))
    assert isinstance(last, bytes)
    assert check_header(last).sequence == MAX_DOWNLINK_SEQ == 2**32 - 93  # type: ignore[union-attr]
    assert sender.seal(b"x") is DropReason.SEQ_EXHAUSTED
    assert sender.drops == {DropReason.SEQ_EXHAUSTED: 1}
    assert sender.last_seq == MAX_DOWNLINK_SEQ


def test_uplink_sender_copies_the_nonce_like_a_device() -> None:
    crypto = new_session_crypto(ScriptedTokens(zero_draws=0, seed=3))
    device = UplinkSender.for_session(crypto)
    datagram = device.seal(b"\xf8\xff\xfe", 2**32 + 7)
    assert datagram[:16] == nonce_for(crypto.ssrc)[:2] + bytes.fromhex("0003") + crypto.nonce[
        4:8
    ] + bytes.fromhex("00000007 00000001")


def test_receiver_refuses_flags_other_than_the_nonces() -> None:
    receiver = UplinkReceiver(key=KEY, ssrc=SSRC)
    assert receiver.accept(raw(flags=0x80)) == Dropped(DropReason.BAD_FLAGS)
    assert receiver.accept(raw(flags=1)) == Dropped(DropReason.BAD_FLAGS)
    assert receiver.last_seq == 0
    assert isinstance(receiver.accept(raw()), Accepted)


@pytest.mark.parametrize("size", [0, 15, 17, 32])
def test_keys_must_be_16_bytes(size: int) -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        UplinkReceiver(key=bytes(size), ssrc=SSRC)


class ScriptedTokens:
    """A deterministic token source: a seeded RNG with some all-zero draws first."""

    def __init__(self, zero_draws: int, seed: int) -> None:
        self.zero_draws = zero_draws
        self.rng = random.Random(seed)

    def token_bytes(self, nbytes: int) -> bytes:
        if nbytes == 4 and self.zero_draws:
            self.zero_draws -= 1
            return bytes(4)
        return self.rng.randbytes(nbytes)


def test_session_crypto_from_a_seeded_source_rejects_zero_ssrc() -> None:
    crypto = new_session_crypto(ScriptedTokens(zero_draws=2, seed=1))
    assert crypto.ssrc != 0
    assert len(crypto.key) == 16
    assert crypto.nonce == nonce_for(crypto.ssrc)
    assert crypto.nonce_hex == "01000000" + f"{crypto.ssrc:08x}" + "0" * 16
    assert crypto.key_hex == crypto.key.hex()
    assert len(crypto.key_hex) == 32


def test_session_crypto_default_source_is_fresh_each_time() -> None:
    a, b = new_session_crypto(), new_session_crypto(secrets)
    assert isinstance(a, SessionCrypto)
    assert a.key != b.key
    assert a.ssrc != 0


def test_session_crypto_interoperates_with_a_device_sender() -> None:
    crypto = new_session_crypto(ScriptedTokens(zero_draws=0, seed=2))
    # A device copies type, flags and ssrc from the nonce (reference §5.2).
    device = UplinkSender(key=bytes.fromhex(crypto.key_hex), ssrc=int(crypto.nonce_hex[8:16], 16))
    receiver = UplinkReceiver.for_session(crypto, max_forward_jump=10)
    assert receiver.max_forward_jump == 10
    assert UplinkSender.for_session(crypto).seal(b"\xf8\xff\xfe") == device.seal(b"\xf8\xff\xfe")
    down = DownlinkSender.for_session(crypto).seal(b"\xf8\xff\xfe")
    assert isinstance(down, bytes)
    assert peek_ssrc(down) == crypto.ssrc | 0x8000_0000
    device = UplinkSender(key=crypto.key, ssrc=crypto.ssrc)
    datagram = device.seal(b"\xf8\xff\xfe")
    assert peek_ssrc(datagram) == crypto.ssrc
    assert receiver.accept(datagram) == Accepted(b"\xf8\xff\xfe", 1, 0, 0)


@pytest.mark.parametrize(
    ("counter_block", "size"),
    [
        (b"\x01" + bytes(15), 0),
        (b"\x01" + bytes(14) + b"\xff", 33),  # carry out of the first byte
        (b"\xff" * 15 + b"\xfe", 40),  # wraps past 2**128 within the message
        (b"\x01" + bytes(15), 4096),  # longer than any datagram
    ],
)
def test_one_reused_cipher_context_equals_a_fresh_ctr_context_per_message(
    counter_block: bytes, size: int
) -> None:
    data = bytes(random.Random(size).randrange(256) for _ in range(size))
    cipher = aes_key(KEY)
    for _ in range(2):  # the same context again gives the same bytes: no state carried
        ours = cipher.transform(counter_block, data)
        fresh = Cipher(algorithms.AES(KEY), modes.CTR(counter_block)).encryptor().update(data)
        assert ours == fresh
        assert len(ours) == size


def test_receiver_without_decryption_still_checks_and_accounts() -> None:
    receiver = UplinkReceiver(key=KEY, ssrc=SSRC)
    d = stream(4)
    assert receiver.accept(d[0], decrypt=False) == Accepted(b"", 1, 0, 0)
    assert receiver.accept(d[0], decrypt=False) == Dropped(DropReason.REPLAY)
    assert receiver.accept(d[3], decrypt=False) == Accepted(b"", 4, 180, 2)
    assert (receiver.last_seq, receiver.accepted, receiver.lost) == (4, 2, 2)


def test_check_and_decrypt_change_nothing_until_take() -> None:
    receiver = UplinkReceiver(key=KEY, ssrc=SSRC)
    datagram = UplinkSender(key=KEY, ssrc=SSRC).seal(b"\xf8\xff\xfe")
    header = receiver.check(datagram)
    assert isinstance(header, Header)
    assert receiver.decrypt(datagram) == b"\xf8\xff\xfe"
    assert receiver.check(datagram) == header  # still fresh: nothing moved
    assert (receiver.last_seq, receiver.accepted) == (0, 0)
    assert receiver.take(datagram, header, decrypt=False) == Accepted(b"", 1, 0, 0)
    assert receiver.check(datagram) == Dropped(DropReason.REPLAY)
    assert receiver.drops == {DropReason.REPLAY: 1}
