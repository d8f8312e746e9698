"""Stream PCM as a device would: 16 kHz mono 60 ms Opus packets, optionally lossy and encrypted.

``encode`` is a real libopus encoder (opuslib), configured like the uplink (VOIP application,
60 ms frames); ``lossy`` drops packets with a seeded RNG; ``datagrams`` seals packets into Xiaozhi
UDP datagrams with a session's key and ssrc (same wire format as the device's uplink).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

import opuslib
from opuslib.api import ctl
from opuslib.api import encoder as encoder_api

from codec.packet import MAX_PAYLOAD
from codec.udp import UplinkSender
from tests.support.speech import RATE, frames

FRAME_MS = 60
FRAME_SAMPLES = RATE * FRAME_MS // 1000  # 960


def encode(
    pcm: bytes,
    *,
    frame_ms: int = FRAME_MS,
    fec_loss_perc: int = 0,
    dtx: bool = False,
    complexity: int | None = None,
    application: str = opuslib.APPLICATION_VOIP,
) -> list[bytes]:
    """Opus packets for ``pcm`` (16 kHz mono s16le), one per ``frame_ms`` frame.

    ``fec_loss_perc`` > 0 turns on in-band FEC tuned for that loss rate (the encoder only adds
    LBRR data when the expected loss is high enough, about 15 % and up at default bitrate).
    Current device firmware encodes with ``application=APPLICATION_AUDIO, dtx=True,
    complexity=0`` (reference §7); :func:`encode_like_device` does that.
    """
    enc = opuslib.Encoder(RATE, 1, application)
    # opuslib's property setters for these drop the value; call the ctl directly.
    if fec_loss_perc:
        encoder_api.encoder_ctl(enc.encoder_state, ctl.set_inband_fec, 1)
        encoder_api.encoder_ctl(enc.encoder_state, ctl.set_packet_loss_perc, fec_loss_perc)
    if dtx:
        encoder_api.encoder_ctl(enc.encoder_state, ctl.set_dtx, 1)
    if complexity is not None:
        encoder_api.encoder_ctl(enc.encoder_state, ctl.set_complexity, complexity)
    samples = RATE * frame_ms // 1000
    return [enc.encode(frame, samples) for frame in frames(pcm, frame_ms)]


def encode_like_device(pcm: bytes) -> list[bytes]:
    """60 ms packets as xiaozhi-esp32 v2.2.2+ sends them: AUDIO application, DTX, complexity 0."""
    return encode(pcm, dtx=True, complexity=0, application=opuslib.APPLICATION_AUDIO)


def lossy(packets: Sequence[bytes], loss: float, seed: int) -> list[bytes | None]:
    """Each packet replaced by ``None`` with probability ``loss`` (seeded, deterministic)."""
    rng = random.Random(seed)
    return [None if rng.random() < loss else p for p in packets]


def datagrams(
    packets: Iterable[bytes], *, key: bytes, ssrc: int, timestamp: int = 0
) -> list[bytes]:
    """Seal packets as a device's uplink: sequence 1, 2, ...; ``timestamp`` as devices send it."""
    sender = UplinkSender(key=key, ssrc=ssrc)
    out: list[bytes] = []
    for packet in packets:
        if len(packet) > MAX_PAYLOAD:
            raise ValueError(f"packet of {len(packet)} bytes does not fit a datagram")
        out.append(sender.seal(packet, timestamp))
    return out
