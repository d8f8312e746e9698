"""Ogg Opus muxing (RFC 7845) of real libopus packets, read back by our demuxer and by opusdec."""

from __future__ import annotations

import shutil
import struct
import subprocess
import wave
from pathlib import Path

import pytest

from gateway.archive.ogg import (
    MAX_PACKET,
    demux_ogg_opus,
    mux_ogg_opus,
    ogg_crc,
    opus_duration_ms,
    opus_head,
    opus_tags,
    packet_samples,
)
from tests.support.opus_stream import encode, encode_like_device
from tests.support.speech import RATE, silence


def test_crc_matches_the_ogg_reference_value() -> None:
    # libogg's CRC of "OggS" with the rest of a zeroed 27-byte header is well known to be stable;
    # check the table-driven code against a bit-by-bit computation instead of a magic number.
    data = bytes(range(256)) * 3
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) & 0xFFFFFFFF if crc & 0x80000000 else crc << 1
    assert ogg_crc(data) == crc
    assert ogg_crc(b"") == 0


def test_packet_samples_from_the_toc() -> None:
    assert packet_samples(bytes([(3 << 3) | 0])) == 2880  # SILK 60 ms, one frame
    assert packet_samples(bytes([(13 << 3) | 1, 0])) == 1920  # hybrid 20 ms, two frames
    assert packet_samples(bytes([(16 << 3) | 2, 0])) == 240  # CELT 2.5 ms, two frames
    assert packet_samples(bytes([(31 << 3) | 3, 6])) == 5760  # CELT 20 ms x 6 = 120 ms
    with pytest.raises(ValueError, match="empty"):
        packet_samples(b"")
    with pytest.raises(ValueError, match="frame count"):
        packet_samples(bytes([3]))
    with pytest.raises(ValueError, match="frames"):
        packet_samples(bytes([(31 << 3) | 3, 0]))
    with pytest.raises(ValueError, match="frames"):
        packet_samples(bytes([(3 << 3) | 3, 3]))  # 180 ms > 120 ms


def test_round_trip_keeps_every_packet_and_the_duration() -> None:
    packets = encode_like_device(silence(3000))
    data = mux_ogg_opus(packets, serial=42)
    content = demux_ogg_opus(data)
    assert content.packets == tuple(packets)
    assert (content.channels, content.pre_skip, content.input_rate) == (1, 0, 16_000)
    assert content.duration_ms == 60.0 * len(packets) == opus_duration_ms(packets)


def test_many_packets_span_several_pages() -> None:
    big = [bytes([(3 << 3)]) + bytes(300)] * 200  # 2 lacing values each: several pages
    data = mux_ogg_opus(big, serial=1)
    assert data.count(b"OggS") > 3
    assert demux_ogg_opus(data).packets == tuple(big)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="no Opus packets"):
        mux_ogg_opus([], serial=1)
    with pytest.raises(ValueError, match="bytes"):
        mux_ogg_opus([bytes(MAX_PACKET + 1)], serial=1)
    good = mux_ogg_opus(encode(silence(120)), serial=1)
    with pytest.raises(ValueError, match="not an Ogg"):
        demux_ogg_opus(b"X" + good[1:])
    with pytest.raises(ValueError, match="truncated Ogg page header"):
        demux_ogg_opus(good[:10])
    with pytest.raises(ValueError, match=r"truncated Ogg page$"):
        demux_ogg_opus(good[:40])
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF
    with pytest.raises(ValueError, match="checksum"):
        demux_ogg_opus(bytes(corrupt))


def _raw_stream(*packets: bytes) -> bytes:
    from gateway.archive.ogg import _page  # noqa: PLC0415  # the page writer alone

    return b"".join(_page(0, 0, 1, i, [p]) for i, p in enumerate(packets))


def test_headers_are_checked() -> None:
    with pytest.raises(ValueError, match="no OpusHead"):
        demux_ogg_opus(_raw_stream(b"nothing", opus_tags()))
    with pytest.raises(ValueError, match="no OpusTags"):
        demux_ogg_opus(_raw_stream(opus_head(), b"nothing"))
    with pytest.raises(ValueError, match="short OpusHead"):
        demux_ogg_opus(_raw_stream(b"OpusHead\x01", opus_tags()))


def test_a_packet_continued_over_a_page_is_joined() -> None:
    from gateway.archive.ogg import _HEADER, OGG_CAPTURE  # noqa: PLC0415

    def page(flags: int, seq: int, lacing: bytes, body: bytes) -> bytes:
        head = _HEADER.pack(OGG_CAPTURE, 0, flags, -1, 1, seq, 0, len(lacing))
        raw = head + lacing + body
        return raw[:22] + struct.pack("<I", ogg_crc(raw)) + raw[26:]

    long = bytes([3 << 3]) + bytes(299)
    data = (
        _raw_stream(opus_head(), opus_tags())
        + page(0, 2, bytes([255]), long[:255])
        + page(1, 3, bytes([45]), long[255:])
    )
    content = demux_ogg_opus(data)
    assert content.packets == (long,)
    assert content.granule == 0  # -1: no packet ends on the page; the last known stays


@pytest.mark.skipif(shutil.which("opusdec") is None, reason="opusdec (opus-tools) missing")
def test_an_independent_decoder_reads_the_file(tmp_path: Path) -> None:
    packets = encode_like_device(silence(1980))
    path = tmp_path / "a.opus"
    path.write_bytes(mux_ogg_opus(packets, serial=3))
    out = tmp_path / "a.wav"
    subprocess.run(
        ["opusdec", "--quiet", "--rate", str(RATE), str(path), str(out)],
        check=True,
        capture_output=True,
    )
    with wave.open(str(out)) as wav:
        assert wav.getnframes() == len(packets) * RATE * 60 // 1000
