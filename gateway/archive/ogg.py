"""Ogg Opus (RFC 7845) muxing and demuxing of a device's own Opus packets: no re-encode.

Why our own page writer rather than a muxer library: what we write is the smallest case of the
format — one mono logical stream of packets that each fit in one page (an Opus packet is at most
1275 bytes x 48 frames = 61,200 bytes < 255 x 255 lacing), an ``OpusHead`` and an ``OpusTags``
page, CRC-32 (polynomial 0x04C11DB7, not reflected) per page. That is ~100 lines and no native
dependency; PyAV would bring all of FFmpeg for it. The files are checked by an independent
decoder (``opusdec``) in the tests.

Granule positions count 48 kHz samples (RFC 7845 §4); a packet's length comes from its TOC byte
(RFC 6716 §3.1). The archive writes a pre-skip of 0: the packets start mid-stream (the device's
encoder was already warm), so the decoded duration is exactly the packets' duration.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

OGG_CAPTURE = b"OggS"
OPUS_HEAD = b"OpusHead"
OPUS_TAGS = b"OpusTags"
VENDOR = b"snlp-gateway"
MAX_SEGMENTS = 255
MAX_PACKET = MAX_SEGMENTS * 255 - 1  # lacing of a packet that must fit in one page
_BOS, _EOS, _CONTINUED = 0x02, 0x04, 0x01
_HEADER = struct.Struct("<4sBBqIIIB")  # capture, version, type, granule, serial, seq, crc, n


_BIT_REVERSED = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))


def ogg_crc(data: bytes) -> int:
    """The Ogg page checksum (CRC-32, poly 0x04C11DB7, init 0, no reflection, no final xor).

    Computed by zlib's C CRC-32 (the same polynomial, reflected, init and final xor ~0): on
    bit-reversed bytes, started from register 0, the result bit-reversed back. About 50x faster
    than a Python table loop (the archive muxes every answer; the tests check it bit by bit)."""
    reflected = zlib.crc32(data.translate(_BIT_REVERSED), 0xFFFFFFFF) ^ 0xFFFFFFFF
    return int(f"{reflected:032b}"[::-1], 2)


_FRAME_SAMPLES = (
    # SILK-only configs 0-11: 10, 20, 40, 60 ms; hybrid 12-15: 10, 20 ms; CELT 16-31: 2.5-20 ms
    *(480, 960, 1920, 2880) * 3,
    *(480, 960) * 2,
    *(120, 240, 480, 960) * 4,
)


def packet_samples(packet: bytes) -> int:
    """48 kHz samples in one Opus packet, from its TOC (RFC 6716 §3.1); ValueError if bad."""
    if not packet:
        raise ValueError("empty Opus packet")
    toc = packet[0]
    code = toc & 0x03
    if code == 0:
        frames = 1
    elif code in (1, 2):
        frames = 2
    else:
        if len(packet) < 2:
            raise ValueError("Opus code-3 packet without its frame count")
        frames = packet[1] & 0x3F
    samples = frames * _FRAME_SAMPLES[toc >> 3]
    if not frames or samples > 5760:  # RFC 6716: at most 120 ms per packet
        raise ValueError(f"Opus packet of {frames} frames, {samples} samples")
    return samples


def opus_head(*, channels: int = 1, pre_skip: int = 0, input_rate: int = 16_000) -> bytes:
    """The identification header (RFC 7845 §5.1), channel mapping family 0."""
    return OPUS_HEAD + struct.pack("<BBHIhB", 1, channels, pre_skip, input_rate, 0, 0)


def opus_tags() -> bytes:
    """The comment header (RFC 7845 §5.2): our vendor string, no user comments."""
    return OPUS_TAGS + struct.pack("<I", len(VENDOR)) + VENDOR + struct.pack("<I", 0)


def _lacing(length: int) -> bytes:
    return bytes([255] * (length // 255) + [length % 255])


def _page(flags: int, granule: int, serial: int, seq: int, packets: Sequence[bytes]) -> bytes:
    lacing = b"".join(_lacing(len(p)) for p in packets)
    header = _HEADER.pack(OGG_CAPTURE, 0, flags, granule, serial, seq, 0, len(lacing))
    page = header + lacing + b"".join(packets)
    crc = ogg_crc(page)
    return page[:22] + struct.pack("<I", crc) + page[26:]


def opus_duration_ms(packets: Iterable[bytes]) -> float:
    """The packets' duration (ValueError for a malformed one)."""
    return sum(packet_samples(p) for p in packets) / 48.0


def mux_ogg_opus(
    packets: Iterable[bytes], *, serial: int, input_rate: int = 16_000, channels: int = 1
) -> bytes:
    """An Ogg Opus file of ``packets`` as they are (ValueError for a malformed or oversized
    packet, or none at all)."""
    pages = [
        _page(_BOS, 0, serial, 0, [opus_head(channels=channels, input_rate=input_rate)]),
        _page(0, 0, serial, 1, [opus_tags()]),
    ]
    granule = 0
    pending: list[bytes] = []
    segments = 0
    for packet in packets:
        if len(packet) > MAX_PACKET:
            raise ValueError(f"Opus packet of {len(packet)} bytes")
        need = len(packet) // 255 + 1
        if segments + need > MAX_SEGMENTS:
            pages.append(_page(0, granule, serial, len(pages), pending))
            pending, segments = [], 0
        granule += packet_samples(packet)
        pending.append(packet)
        segments += need
    if not pending:
        raise ValueError("no Opus packets to archive")
    pages.append(_page(_EOS, granule, serial, len(pages), pending))
    return b"".join(pages)


@dataclass(frozen=True, slots=True)
class OggOpusContent:
    """A demuxed Ogg Opus stream: its audio packets and what its headers say."""

    packets: tuple[bytes, ...]
    channels: int
    pre_skip: int
    input_rate: int
    granule: int  # the last page's granule position (48 kHz samples)

    @property
    def duration_ms(self) -> float:
        return (self.granule - self.pre_skip) / 48.0


def demux_ogg_opus(data: bytes) -> OggOpusContent:
    """The packets of the first logical stream of ``data`` (ValueError if not Ogg Opus, a bad
    checksum or a truncated page)."""
    packets: list[bytes] = []
    partial = b""
    granule = 0
    pos = 0
    while pos < len(data):
        if len(data) - pos < _HEADER.size:
            raise ValueError("truncated Ogg page header")
        capture, _version, flags, page_granule, _serial, _seq, crc, n = _HEADER.unpack_from(
            data, pos
        )
        if capture != OGG_CAPTURE:
            raise ValueError("not an Ogg page")
        lacing = data[pos + _HEADER.size : pos + _HEADER.size + n]
        body_at = pos + _HEADER.size + n
        end = body_at + sum(lacing)
        if len(lacing) < n or end > len(data):
            raise ValueError("truncated Ogg page")
        page = data[pos:end]
        if ogg_crc(page[:22] + b"\0\0\0\0" + page[26:]) != crc:
            raise ValueError("Ogg page checksum mismatch")
        if not flags & _CONTINUED:
            partial = b""
        at = body_at
        for value in lacing:
            partial += data[at : at + value]
            at += value
            if value < 255:
                packets.append(partial)
                partial = b""
        if page_granule >= 0:
            granule = page_granule
        pos = end
    if len(packets) < 2 or not packets[0].startswith(OPUS_HEAD):
        raise ValueError("no OpusHead")
    if not packets[1].startswith(OPUS_TAGS):
        raise ValueError("no OpusTags")
    head = packets[0]
    if len(head) < 19:
        raise ValueError("short OpusHead")
    _ver, channels, pre_skip, input_rate, _gain, _family = struct.unpack_from("<BBHIhB", head, 8)
    return OggOpusContent(tuple(packets[2:]), channels, pre_skip, input_rate, granule)
