"""What a spoken line costs SPEAK before its first frame can go: espeak-ng synthesis + sox
resample + libopus encoding of a short task phrase (a phrase-cache miss), and a cache hit.

Run from the repo root: ``python -m bench.speech_bench``. Writes bench/results/speech.json and
bench/results/speech.md. Sequential, one phrase at a time (what one synthesis slot does); each
phrase is made ``REPEATS`` times. The inline assessment budget (listen end → first feedback
audio, issue #27) takes its synthesis share from here.
"""

from __future__ import annotations

import platform
import statistics
import time

from bench.stats import record
from gateway.speech.cache import PhraseCache, PhraseKey
from gateway.speech.engines import EspeakTts, encode

REPEATS = 3
RATE, FRAME_MS = 16_000, 60
PHRASES = {
    "en": ["Three.", "Well done!", "Seven plus two?", "Say them backwards: four, nine, one.",
           "Not quite. Let us try another one.", "What is eight minus five?"],
    "zh": ["三", "太棒了", "七加二等于几", "请倒着说 四 九 一", "不对哦 我们再试一个", "画蛇添足"],
}  # fmt: skip


def main() -> None:
    engine = EspeakTts({"en": "en-us", "zh": "cmn"})
    rows: dict[str, dict[str, float]] = {}
    for voice, phrases in PHRASES.items():
        miss_ms: list[float] = []
        audio_ms: list[float] = []
        for _ in range(REPEATS):
            for text in phrases:
                began = time.perf_counter()
                frames = encode(engine.synthesize(text, voice, RATE), RATE, FRAME_MS)
                miss_ms.append((time.perf_counter() - began) * 1000)
                audio_ms.append(len(frames) * FRAME_MS)
        rows[voice] = {
            "phrases": len(miss_ms),
            "miss_p50_ms": statistics.median(miss_ms),
            "miss_max_ms": max(miss_ms),
            "audio_p50_ms": statistics.median(audio_ms),
            "real_time_factor": sum(miss_ms) / sum(audio_ms),
        }
    cache = PhraseCache(16 * 1024 * 1024)
    key = PhraseKey("espeak", "en", "Well done!", RATE, FRAME_MS)
    cache.put(key, encode(engine.synthesize("Well done!", "en", RATE), RATE, FRAME_MS))
    began = time.perf_counter()
    for _ in range(10_000):
        cache.get(key)
    hit_us = (time.perf_counter() - began) / 10_000 * 1e6
    machine = {"python": platform.python_version(), "platform": platform.platform()}
    lines = [
        "# SPEAK synthesis benchmark (python -m bench.speech_bench)",
        "",
        f"espeak-ng → sox (16 kHz) → libopus 60 ms frames; {REPEATS} passes over short task "
        "phrases, sequential (one synthesis slot).",
        "",
        "| voice | phrases | miss p50 ms | miss max ms | audio p50 ms | wall / audio |",
        "|---|---|---|---|---|---|",
    ]
    for voice, row in rows.items():
        lines.append(
            f"| {voice} | {row['phrases']:.0f} | {row['miss_p50_ms']:.1f} | "
            f"{row['miss_max_ms']:.1f} | {row['audio_p50_ms']:.0f} | "
            f"{row['real_time_factor']:.3f} |"
        )
    lines += ["", f"Phrase cache hit: {hit_us:.2f} µs.", "", f"Machine: {machine}", ""]
    record("speech", {"voices": rows, "cache_hit_us": hit_us, "machine": machine}, "\n".join(lines))


if __name__ == "__main__":
    main()
