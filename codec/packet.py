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


def check_header(datagram: bytes) -> Header | DropReason:
    """Validate the framing of ``datagram`` (no crypto) and return its header fields."""
    size = len(datagram)
    if size < HEADER_SIZE:
        return DropReason.TOO_SHORT
    if size > MAX_DATAGRAM:
        return DropReason.TOO_LARGE
    ptype, flags, payload_len, ssrc, timestamp, sequence = HEADER.unpack_from(datagram)
    if ptype != PACKET_TYPE:
        return DropReason.BAD_TYPE
    if size != HEADER_SIZE + payload_len:
        return DropReason.LENGTH_MISMATCH
    return Header(ssrc, timestamp, sequence, payload_len, flags, ptype)


def peek_ssrc(datagram: bytes) -> int | DropReason:
    """Routing key of a datagram, after the cheap framing checks and before any crypto."""
    header = check_header(datagram)
    if isinstance(header, DropReason):
        return header
    return header.ssrc


def ctr_transform(key: algorithms.AES, counter_block: bytes, data: bytes) -> bytes:
    """AES-128-CTR with ``counter_block`` as the initial counter; encrypts and decrypts alike."""
    return Cipher(key, modes.CTR(counter_block)).encryptor().update(data)


def seal(key: algorithms.AES, header: Header, opus_packet: bytes) -> bytes:
    """Build a datagram: the header (with ``payload_len`` set by the caller) + ciphertext."""
    head = header.pack()
    return head + ctr_transform(key, head, opus_packet)


def open_payload(key: algorithms.AES, datagram: bytes) -> bytes:
    """Decrypt the payload of a datagram whose header :func:`check_header` accepted."""
    return ctr_transform(key, datagram[:HEADER_SIZE], datagram[HEADER_SIZE:])


def aes_key(key: bytes) -> algorithms.AES:
    """The AES-128 key object, built once per session."""
    if len(key) != KEY_SIZE:
        raise ValueError(f"AES-128 key must be {KEY_SIZE} bytes, got {len(key)}")
    return algorithms.AES(key)
