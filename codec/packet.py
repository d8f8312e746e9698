"""Xiaozhi UDP datagram layout and its AES-128-CTR transform (reference §5.1, §5.2).

One datagram = a 16-byte big-endian header followed by one AES-128-CTR encrypted Opus packet::

    offset 0  u8   type          always 0x01
    offset 1  u8   flags         reserved (copied from the nonce, never checked by devices)
    offset 2  u16  payload_len   exact length of the encrypted payload
    offset 4  u32  ssrc          per-session routing id (nonce bytes 4..7)
    offset 8  u32  timestamp     ms, sender-chosen (devices send 0)
    offset 12 u32  sequence      per direction, first packet = 1

The header *is* the initial counter block: the keystream is AES-128 of the header, then of the
header + 1, ... as one 128-bit big-endian integer (``cryptography``'s ``modes.CTR``, OpenSSL's
``aes-128-ctr`` and mbedTLS all agree). There is no padding and no MAC.

Everything here is pure: no sockets, no clock, no exceptions for bad input — header checks
return a :class:`DropReason` the caller counts.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

HEADER = struct.Struct(">BBHIII")
HEADER_SIZE = HEADER.size  # 16
PACKET_TYPE = 0x01
MAX_DATAGRAM = 1500  # the device's receive buffer (reference §5.5)
MAX_PAYLOAD = MAX_DATAGRAM - HEADER_SIZE  # 1484
KEY_SIZE = 16
U32 = 0xFFFFFFFF


class DropReason(enum.Enum):
    """Why a datagram was not accepted. Values are stable metric label values."""

    TOO_SHORT = "too_short"  # fewer than 16 bytes
    TOO_LARGE = "too_large"  # more than 1500 bytes
    BAD_TYPE = "bad_type"  # type byte is not 0x01
    LENGTH_MISMATCH = "length_mismatch"  # datagram length != 16 + payload_len
    UNKNOWN_SSRC = "unknown_ssrc"  # no session owns this ssrc (or not the receiver's)
    REPLAY = "replay"  # sequence <= the last accepted one (duplicate or old)
    SEQ_JUMP = "seq_jump"  # sequence too far ahead of the last accepted one
    IMPLAUSIBLE = "implausible"  # decrypts to no frame this session's device sends (rebind)
    REBIND_PENDING = "rebind_pending"  # plausible, but a new source needs 3 in a row (rebind)
    BAD_FLAGS = "bad_flags"  # uplink flags other than the nonce's (0x80 marks the downlink)
    SEQ_EXHAUSTED = "seq_exhausted"  # downlink sequence space used up (codec.counter_space)


@dataclass(frozen=True, slots=True)
class Header:
    """The 16 header bytes as fields."""

    ssrc: int
    timestamp: int
    sequence: int
    payload_len: int
    flags: int = 0
    type: int = PACKET_TYPE

    def pack(self) -> bytes:
        return HEADER.pack(
            self.type, self.flags, self.payload_len, self.ssrc, self.timestamp, self.sequence
        )


Fields = tuple[int, int, int, int, int, int]  # type, flags, payload_len, ssrc, timestamp, sequence


def unpack_header(datagram: bytes) -> Fields | DropReason:
    """:func:`check_header` without building a :class:`Header`: the six fields in wire order
    (type, flags, payload_len, ssrc, timestamp, sequence), for the per-datagram hot path."""
    size = len(datagram)
    if size < HEADER_SIZE:
        return DropReason.TOO_SHORT
    if size > MAX_DATAGRAM:
        return DropReason.TOO_LARGE
    fields: Fields = HEADER.unpack_from(datagram)
    if fields[0] != PACKET_TYPE:
        return DropReason.BAD_TYPE
    if size != HEADER_SIZE + fields[2]:
        return DropReason.LENGTH_MISMATCH
    return fields


def check_header(datagram: bytes) -> Header | DropReason:
    """Validate the framing of ``datagram`` (no crypto) and return its header fields."""
    fields = unpack_header(datagram)
    if isinstance(fields, DropReason):
        return fields
    ptype, flags, payload_len, ssrc, timestamp, sequence = fields
    return Header(ssrc, timestamp, sequence, payload_len, flags, ptype)


def peek_ssrc(datagram: bytes) -> int | DropReason:
    """Routing key of a datagram, after the cheap framing checks and before any crypto."""
    fields = unpack_header(datagram)
    if isinstance(fields, DropReason):
        return fields
    return fields[3]


_BLOCK = 16
_COUNTER_MOD = 1 << 128
_TABLE_BLOCKS = -(-MAX_DATAGRAM // _BLOCK)  # 94 blocks: any payload a datagram can carry


def _counter_tables(blocks: int) -> tuple[list[int], list[int]]:
    """``repunit[n]``, ``ramp[n]``: the blocks ``c, c+1, … c+n-1`` written one after another as
    one big-endian integer are ``c·repunit[n] + ramp[n]`` (no carry between blocks while
    ``c + n - 1 < 2**128``)."""
    repunit, ramp = [0], [0]
    for n in range(1, blocks + 1):
        repunit.append((repunit[-1] << 128) | 1)
        ramp.append((ramp[-1] << 128) + n - 1)
    return repunit, ramp


_REPUNIT, _RAMP = _counter_tables(_TABLE_BLOCKS)


class CtrCipher:
    """AES-128-CTR under one key for many short messages, each with its own initial counter
    block, through ONE cipher context built once per session.

    ``cryptography`` binds the counter to a context, and building a context per datagram
    (key schedule included) costs more than the AES itself. CTR is AES of the counter blocks
    XORed onto the data, so this encrypts the message's counter blocks with a reusable ECB
    context (each block independent, no state carried between calls) and XORs the keystream
    on: the same bytes as ``modes.CTR(counter_block)``, checked against OpenSSL's
    ``aes-128-ctr`` by the committed vectors. A counter that would wrap past 2**128 within the
    message (impossible for a datagram header, whose type byte is 0x01) or data longer than a
    datagram take the per-message context path.
    """

    __slots__ = ("_aes", "_ecb", "_update")

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_SIZE:
            raise ValueError(f"AES-128 key must be {KEY_SIZE} bytes, got {len(key)}")
        self._aes = algorithms.AES(key)
        # ECB here only ever encrypts CTR counter blocks: this IS counter mode (see above).
        self._ecb = Cipher(self._aes, modes.ECB()).encryptor()  # noqa: S305
        self._update = self._ecb.update

    def transform(self, counter_block: bytes, data: bytes) -> bytes:
        """Encrypt or decrypt ``data`` (CTR is its own inverse)."""
        size = len(data)
        blocks = -(-size // _BLOCK)
        counter = int.from_bytes(counter_block, "big")
        if blocks > _TABLE_BLOCKS or counter + blocks > _COUNTER_MOD:
            return Cipher(self._aes, modes.CTR(counter_block)).encryptor().update(data)
        stream = self._update(
            (counter * _REPUNIT[blocks] + _RAMP[blocks]).to_bytes(blocks * _BLOCK, "big")
        )
        mixed = int.from_bytes(data, "big") ^ int.from_bytes(stream[:size], "big")
        return mixed.to_bytes(size, "big")


def ctr_transform(key: CtrCipher, counter_block: bytes, data: bytes) -> bytes:
    """AES-128-CTR with ``counter_block`` as the initial counter; encrypts and decrypts alike."""
    return key.transform(counter_block, data)


def seal(key: CtrCipher, header: Header, opus_packet: bytes) -> bytes:
    """Build a datagram: the header (with ``payload_len`` set by the caller) + ciphertext."""
    head = header.pack()
    return head + ctr_transform(key, head, opus_packet)


def open_payload(key: CtrCipher, datagram: bytes) -> bytes:
    """Decrypt the payload of a datagram whose header :func:`check_header` accepted."""
    return ctr_transform(key, datagram[:HEADER_SIZE], datagram[HEADER_SIZE:])


def aes_key(key: bytes) -> CtrCipher:
    """The session's AES-128-CTR cipher, built once per session."""
    return CtrCipher(key)
