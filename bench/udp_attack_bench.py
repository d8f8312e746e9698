"""CPU a forged sequence jump costs the uplink path (decode + VAD), per datagram.

Run from the repo root: ``python -m bench.udp_attack_bench``. Writes
bench/results/udp_attack.json and .md. A keyless datagram whose sequence jumps 999 frames ahead
is accepted by the receiver (AES-CTR has no MAC) and reported as 998 lost frames. Measured:

* ``now``: what the pipeline does today — the gap is over the concealment limit (5 frames), so
  the decoder is reset and only the datagram's own (garbage) payload is decoded and pushed
  through the VAD;
* ``before``: what it did until issue 10 — 5 PLC frames, 993 frames of zeros, and the VAD over
  all 999 frames (60 s of PCM) — rebuilt from today's decoder and VAD;
* ``conceal_5``: the most a gap may cost now (5 PLC frames + the packet), for scale.

Each case runs in fresh decoder/VAD state primed with real speech; the headline is the best
(minimum) of the passes, the median beside it (shared machine: other processes only add time).
"""

from __future__ import annotations

import platform
import random
import statistics
import time
from collections.abc import Callable

from bench.stats import record
from codec.opus import OpusStreamDecoder
from codec.vad import VadSegmenter
from tests.support.opus_stream import encode
from tests.support.speech import compose

PASSES = 15
DATAGRAMS = 20  # forged datagrams per pass
JUMP = 999


def primed() -> tuple[OpusStreamDecoder, VadSegmenter]:
    decoder, vad = OpusStreamDecoder(), VadSegmenter()
    for packet in PRIMER:
        vad.push(decoder.decode(packet))
    return decoder, vad


def now(payload: bytes) -> None:
    decoder, vad = primed()
    for _ in range(DATAGRAMS):
        vad.push(decoder.decode(payload, JUMP - 1))


def before(payload: bytes) -> None:
    decoder, vad = primed()
    frame_bytes = 2 * decoder.frame_samples
    for _ in range(DATAGRAMS):
        pcm = decoder.conceal(5) + bytes(frame_bytes * (JUMP - 1 - 5)) + decoder.decode(payload)
        vad.push(pcm)


def conceal_5(payload: bytes) -> None:
    decoder, vad = primed()
    for _ in range(DATAGRAMS):
        vad.push(decoder.decode(payload, 5))


def measure(case: Callable[[bytes], None], payload: bytes) -> list[float]:
    """Milliseconds per forged datagram, one value per pass."""
    out = []
    for _ in range(PASSES):
        start = time.perf_counter()
        case(payload)
        out.append((time.perf_counter() - start) * 1000 / DATAGRAMS)
    return out


PRIMER = encode(compose([300, "Good morning, how are you?", 300]).pcm)[:20]


def main() -> None:
    payload = random.Random(1).randbytes(120)  # what a keyless payload decrypts to
    primer_ms = min(measure(lambda _p: primed() and None, payload))  # priming share, subtracted
    results = {}
    for name, case in (("now", now), ("before", before), ("conceal_5", conceal_5)):
        runs = [max(0.0, r - primer_ms) for r in measure(case, payload)]
        results[name] = {"best_ms": min(runs), "median_ms": statistics.median(runs)}
    report = {
        "machine": platform.machine(),
        "python": platform.python_version(),
        "note": "shared 2-core machine, other sessions running",
        "jump_frames": JUMP,
        "per_forged_datagram": results,
    }
    rows = [
        f"| {name} | {r['best_ms']:.3f} | {r['median_ms']:.3f} |" for name, r in results.items()
    ]
    ratio = results["before"]["best_ms"] / max(results["now"]["best_ms"], 1e-9)
    record(
        "udp_attack",
        report,
        "# Forged sequence jump: CPU per datagram on the uplink path\n\n"
        f"A keyless datagram jumping {JUMP} frames ahead; decode + VAD per datagram "
        "(`python -m bench.udp_attack_bench`; shared 2-core machine).\n\n"
        "| case | best ms | median ms |\n|---|---|---|\n" + "\n".join(rows) + "\n\n"
        f"`before` / `now`: {ratio:.0f}x. `now` resets the decoder (gap over 5 frames) and "
        "decodes only the datagram's own payload; `before` concealed 5 frames, zero-filled 993 "
        "and ran the VAD over 60 s of PCM.\n",
    )


if __name__ == "__main__":
    main()
