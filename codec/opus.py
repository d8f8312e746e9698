"""Opus uplink decoding (16 kHz mono, 60 ms frames) with loss concealment, over libopus.

One :class:`OpusStreamDecoder` per session. It calls libopus's ``opus_decode`` (the library
opuslib loads) through a ctypes function of its own whose arguments need no conversion per
call (the decoder state and the output buffer go in as prebuilt ``c_void_p``), into one
preallocated output buffer that is copied out through a memoryview (opuslib's own
``Decoder.decode`` allocates a buffer and builds a Python list of samples per call, several
times slower). Returned PCM is s16le bytes.

Loss handling, driven by the receiver's ``lost_before``:

* the last lost frame is rebuilt from the in-band FEC (LBRR) data of the packet that follows it,
  when that packet carries any (``decode_fec=1``); otherwise, and for the earlier lost frames,
  libopus packet-loss concealment runs (decode with no data);
* a gap longer than ``plc_limit`` (5) frames is not concealed at all: PLC fades to silence
  within a few frames anyway, and a forged sequence jump (AES-CTR has no MAC) must not buy
  hundreds of PLC runs and megabytes of PCM per datagram. The decoder is reset instead
  (``resets``, ``gap_frames`` count it) and returns only the packet's own audio; the caller
  restarts its stream clock at that packet (the pipeline does, from the sequence number);
* an empty payload is a lost frame; a 1-2 byte DTX packet decodes normally (comfort noise);
* a packet libopus rejects costs one concealed frame and a ``decode_errors`` count, never an
  exception.
"""

from __future__ import annotations

import ctypes
import weakref
from dataclasses import dataclass
from typing import Any, Final

from opuslib.api import ctl as _ctl
from opuslib.api import decoder as _api

_MAX_PACKET_MS: Final = 120  # longest Opus packet
_SILK_MS: Final = (10, 20, 40, 60)
_FRAME_MS: Final = (10, 20, 40, 60, 80, 100, 120)
# Our own function object (item lookup builds a fresh one; attribute lookup would share and
# retype opuslib's): state and buffer are passed as prebuilt c_void_p, nothing is converted.
_opus_decode = _api.opuslib.api.libopus["opus_decode"]
_opus_decode.argtypes = (
    ctypes.c_void_p,
    ctypes.c_char_p,
    ctypes.c_int32,
    ctypes.c_void_p,
    ctypes.c_int,
    ctypes.c_int,
)
_opus_decode.restype = ctypes.c_int
_parse = _api.opuslib.api.libopus.opus_packet_parse
_parse.argtypes = (
    ctypes.c_char_p,
    ctypes.c_int32,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_int16),
    ctypes.POINTER(ctypes.c_int),
)
_parse.restype = ctypes.c_int


def has_lbrr(packet: bytes) -> bool:
    """Whether an Opus packet carries SILK in-band FEC (LBRR) for the frame before it.

    RFC 6716 §4.2.3-4.2.4: a SILK or hybrid frame's first range-coded bits are the per-20 ms
    voice-activity flags and then the LBRR flag (per channel). Those first symbols are coded at
    probability 1/2, so they are the top bits of the frame's first byte.
    """
    if not packet:
        return False
    config = packet[0] >> 3
    if config >= 16:  # CELT-only: no SILK layer, no LBRR
        return False
    silk_ms = _SILK_MS[config & 3] if config < 12 else (10, 20)[config & 1]
    nb = max(1, silk_ms // 20)
    sizes = (ctypes.c_int16 * 48)()
    offset = ctypes.c_int()
    if _parse(packet, len(packet), None, None, sizes, ctypes.byref(offset)) <= 0 or sizes[0] == 0:
        return False
    first = packet[offset.value]
    lbrr = (first >> (7 - nb)) & 1
    if packet[0] & 0x4:  # stereo: the side channel's flags follow the mid channel's
        lbrr |= (first >> (6 - 2 * nb)) & 1
    return bool(lbrr)


def plausible_frame(packet: bytes) -> bool:
    """Whether ``packet`` parses as one mono Opus packet (TOC, frame count and frame lengths
    consistent), as every frame of a Xiaozhi uplink does. A datagram decrypted under the wrong
    key is random bytes, which often fail this; the UDP endpoint asks it of a datagram before
    moving a session to a new source address (with the TOC byte the session already used)."""
    if not packet or packet[0] & 0x4:  # empty, or the stereo bit
        return False
    sizes = (ctypes.c_int16 * 48)()
    offset = ctypes.c_int()
    frames: int = _parse(packet, len(packet), None, None, sizes, ctypes.byref(offset))
    return frames > 0


@dataclass(slots=True)
class DecoderCounters:
    frames_decoded: int = 0  # packets decoded (DTX included)
    concealed: int = 0  # frames synthesized: PLC, empty or rejected packets
    fec_recovered: int = 0  # lost frames rebuilt from the next packet's FEC data
    decode_errors: int = 0  # packets libopus rejected
    resets: int = 0  # gaps over plc_limit: decoder reset instead of concealing
    gap_frames: int = 0  # lost frames in those gaps (not synthesized)


class OpusStreamDecoder:
    """Stateful per-session decoder; :meth:`decode` never raises on packet content."""

    def __init__(self, *, sample_rate: int = 16_000, frame_ms: int = 60, plc_limit: int = 5):
        if frame_ms not in _FRAME_MS:
            raise ValueError(f"frame_ms must be one of {_FRAME_MS}, got {frame_ms}")
        self._state: Any = _api.create_state(sample_rate, 1)
        self._finalizer = weakref.finalize(self, _api.destroy, self._state)
        self.sample_rate = sample_rate
        self.frame_samples = sample_rate * frame_ms // 1000
        self.plc_limit = plc_limit
        self.counters = DecoderCounters()
        self._max = sample_rate * _MAX_PACKET_MS // 1000
        self._buf = (ctypes.c_int16 * self._max)()
        self._handle = ctypes.c_void_p(ctypes.cast(self._state, ctypes.c_void_p).value)
        self._out = ctypes.c_void_p(ctypes.addressof(self._buf))
        self._pcm = memoryview(self._buf).cast("B")  # the output buffer's bytes
        self._last_samples = self.frame_samples  # PLC length follows the stream's frame size

    def decode(self, packet: bytes, lost_before: int = 0) -> bytes:
        """PCM for ``lost_before`` concealed frames followed by ``packet``'s own audio; past
        ``plc_limit`` lost frames, a decoder reset and only ``packet``'s audio."""
        if lost_before:
            return self._fill_gap(lost_before, packet) + self._decode(packet)
        return self._decode(packet)

    def conceal(self, frames: int = 1) -> bytes:
        """PCM for ``frames`` lost frames with no following packet (PLC; none past the limit)."""
        return self._fill_gap(frames, b"")

    def close(self) -> None:
        self._finalizer()

    def _decode(self, packet: bytes) -> bytes:
        if not packet:
            return self._plc()
        n = _opus_decode(self._handle, packet, len(packet), self._out, self._max, 0)
        if n < 0:
            self.counters.decode_errors += 1
            return self._plc()
        self.counters.frames_decoded += 1
        self._last_samples = n
        return self._pcm[: 2 * n].tobytes()

    def _plc(self) -> bytes:
        self.counters.concealed += 1
        # Cannot fail: no data and a valid frame size (see _fec).
        n = _opus_decode(self._handle, None, 0, self._out, self._last_samples, 0)
        return self._pcm[: 2 * n].tobytes()

    def _fill_gap(self, frames: int, next_packet: bytes) -> bytes:
        if frames > self.plc_limit:
            # Cannot fail on a valid decoder state (OPUS_RESET_STATE takes no argument).
            _api.decoder_ctl(self._state, _ctl.reset_state)
            self.counters.resets += 1
            self.counters.gap_frames += frames
            return b""
        fec = has_lbrr(next_packet)
        parts = [self._plc() for _ in range(frames - 1 if fec else frames)]
        if fec:
            parts.append(self._fec(next_packet))
        return b"".join(parts)

    def _fec(self, packet: bytes) -> bytes:
        # Cannot fail: the packet parsed in has_lbrr and _last_samples is a frame size libopus
        # itself returned (or a validated 10-120 ms); a too-short frame_size makes it run PLC.
        n = _opus_decode(self._handle, packet, len(packet), self._out, self._last_samples, 1)
        self.counters.fec_recovered += 1
        return self._pcm[: 2 * n].tobytes()
