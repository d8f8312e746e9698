"""Disjoint AES-CTR counter spaces for the two directions of one Xiaozhi UDP session.

Both directions encrypt under the session's one key, and every datagram's 16-byte header is
its initial counter block (:mod:`codec.packet`). If a downlink header ever equalled an uplink
header (or one of the blocks CTR derives from it), the two payloads would share keystream and
``C1 ⊕ C2 = P1 ⊕ P2``. The upstream gateway sends flags 0, sequence from 1 and timestamp 0
downlink, so its downlink blocks are exactly the device's uplink ones. Ours cannot be.

What a device does (78/xiaozhi-esp32 ``main/protocols/mqtt_protocol.cc``, HEAD 48142026, read
for this): on send it copies the server's nonce and overwrites ``payload_len``, ``timestamp``
and ``sequence``, so bytes 0, 1 and 4..7 of every uplink header are the nonce's: type 0x01,
flags 0x00, the session ssrc. On receive it checks the size (≥ 16, and exactly
16 + ``payload_len``), type 0x01 and ``sequence > last`` (a gap is only logged), then decrypts
with the received 16 header bytes as the counter block; flags, ssrc and timestamp are never
checked. So the downlink may carry any flags, ssrc and timestamp.

The spaces (a block is a 128-bit big-endian integer; a payload of ``n`` bytes uses the blocks
``H, H+1, ..., H+k-1`` with ``k = ceil(n / 16)``):

* uplink: ``H = 01 00 <len> <ssrc> <ts> <seq>`` — ssrc < 2**31 (:data:`UPLINK_SSRC_MASK`),
  anything at all in len, ts and seq (a device or attacker chooses them);
* downlink: ``H = 01 80 <len> <ssrc | 2**31> <60·seq mod 2**32> <seq>`` with ``len ≤ 1484`` and
  ``1 ≤ seq ≤`` :data:`MAX_DOWNLINK_SEQ` (the sender refuses to go further).

Claim 1 — no downlink block equals an uplink block. An uplink payload is at most 65535 bytes,
so ``k ≤ 4096``; adding ``i < 4096`` to ``H`` can carry out of the low 112 bits at most once,
so byte 1 of every uplink block is 0x00 or 0x01. A downlink payload has ``k ≤ 93`` and
``seq + 92 ≤ 2**32 - 1``, so adding ``j < 93`` never carries out of the sequence field: every
downlink block has byte 1 = 0x80. 0x80 ∉ {0x00, 0x01}.

Claim 2 — no two downlink packets of a session share a block. The blocks of the packet with
sequence ``s`` are ``P(s) ‖ (s + j)`` for ``j < 93``, with the 12-byte prefix
``P(s) = 01 80 <len> <ssrc'> <60·s mod 2**32>`` (no carry, as above). Two packets ``s < t``
can share a block only if ``P(s) = P(t)`` and ``t - s ≤ 92``. Equal prefixes need
``60·(t - s) ≡ 0 (mod 2**32)``, i.e. ``2**30`` divides ``t - s`` (60 = 4·15), so
``t - s ≥ 2**30 > 92``: impossible.

Claim 3 (defence in depth) — a captured downlink datagram reflected at the gateway never
reaches a session: its ssrc has the top bit set and sessions are only ever given ssrcs without
it, so it is an unknown ssrc; and the receiver refuses uplink flags other than 0x00 anyway.

Keys are fresh per hello, so blocks of different sessions never meet under one key.
``tests/unit/codec/test_counter_space.py`` checks the claims with hypothesis over ssrc,
sequence, length and timestamp, and ``tests/adversarial/test_keystream.py`` on real sockets.
"""

from __future__ import annotations

from typing import Final

from codec.packet import HEADER, HEADER_SIZE, MAX_PAYLOAD, PACKET_TYPE, U32

UPLINK_FLAGS: Final = 0x00  # the nonce's flags byte, which devices copy
DOWNLINK_FLAGS: Final = 0x80
DOWNLINK_SSRC_BIT: Final = 0x8000_0000
UPLINK_SSRC_MASK: Final = 0x7FFF_FFFF  # session ssrcs never have the top bit
DOWNLINK_TS_STEP: Final = 60  # ms per downlink packet: the session's downlink stream time
MAX_BLOCKS: Final = -(-MAX_PAYLOAD // HEADER_SIZE)  # 93 blocks in a 1484-byte payload
MAX_DOWNLINK_SEQ: Final = U32 - (MAX_BLOCKS - 1)  # no carry out of the sequence field


def downlink_ssrc(ssrc: int) -> int:
    """The ssrc field of the session's downlink headers (never a session's routing ssrc)."""
    return (ssrc | DOWNLINK_SSRC_BIT) & U32


def downlink_timestamp(seq: int) -> int:
    """Per-packet timestamp: 60 ms of downlink stream time per packet (unique, Claim 2)."""
    return (seq * DOWNLINK_TS_STEP) & U32


def downlink_header(ssrc: int, seq: int, payload_len: int) -> bytes:
    """The 16 header bytes (= initial counter block) of downlink packet ``seq``."""
    if not 1 <= seq <= MAX_DOWNLINK_SEQ or not 0 <= payload_len <= MAX_PAYLOAD:
        raise ValueError("downlink sequence or length out of range")
    return HEADER.pack(
        PACKET_TYPE,
        DOWNLINK_FLAGS,
        payload_len,
        downlink_ssrc(ssrc),
        downlink_timestamp(seq),
        seq,
    )


def counter_blocks(header: bytes, payload_len: int) -> range:
    """The counter blocks (as integers) AES-CTR uses for a payload of ``payload_len`` bytes."""
    first = int.from_bytes(header[:HEADER_SIZE], "big")
    return range(first, first + -(-payload_len // HEADER_SIZE))
