"""The embedded offline engine: pocketsphinx 5 with the en-us model from its PyPI package.

Runs inside an ASR worker process (CPU-bound; see ``procpool``), never on the event loop.
A speech gate (WebRTC VAD) returns empty text for audio without speech, because the
recogniser otherwise "hears" a word in pure silence.

A job that names an :class:`~gateway.assessment.jobs.AnswerGrammar` (inline number tasks) is
decoded with a small JSGF decoder for that grammar instead (:mod:`gateway.assessment.grammar`;
options per grammar in ``GRAMMAR_OPTIONS``), the audio cut ``GRAMMAR_TAIL_MS`` after its last
voiced frame (the speech gate's own pass finds it). Measured on espeak-ng answers: a number
~20-30 ms CPU against ~110-130 ms with the lesson LM, a digit sequence ~100 ms against ~240 ms,
each with as many or more right (bench/asr_bench.py).
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import webrtcvad
from pocketsphinx import Decoder

from gateway.assessment.grammar import grammar_jsgf, grammar_words
from gateway.assessment.jobs import (
    SAMPLE_BYTES,
    SAMPLE_RATE,
    AnswerGrammar,
    AsrFailure,
    AsrResult,
    audio_ms,
    check_pcm,
)
from gateway.assessment.lesson_lm import GENERIC_WORDS, lesson_arpa, lesson_words

_VAD_FRAME_BYTES = SAMPLE_RATE * 30 // 1000 * 2  # 30 ms frames

# Decoder options per grammar, chosen by measurement on espeak-ng speech (docs/tasks.md):
# numbers: ds=2 (every other frame scored) cut the CPU by ~30 % with as many answers right
# (ds=3, topn=2 or wider beams lost answers); digit sequences: ds=2 lost half of them, and a
# low word insertion penalty (wip) stops the digit loop from inserting short words.
GRAMMAR_OPTIONS: dict[AnswerGrammar, dict[str, float]] = {
    AnswerGrammar.NUMBER: {"ds": 2},
    AnswerGrammar.DIGITS: {"wip": 0.01},
}
# Audio kept after the last voiced 30 ms frame for a grammar decode (webrtcvad's own overhang
# already follows the speech); the rest of the VAD's post-roll is silence the decoder would
# search for nothing.
GRAMMAR_TAIL_MS = 150


def speech_extent(pcm: bytes, *, mode: int = 2) -> tuple[int, int]:
    """(milliseconds of 30 ms frames WebRTC VAD calls speech, byte offset after the last one)."""
    vad = webrtcvad.Vad(mode)
    voiced = end = 0
    for i in range(0, len(pcm) - _VAD_FRAME_BYTES + 1, _VAD_FRAME_BYTES):
        if vad.is_speech(pcm[i : i + _VAD_FRAME_BYTES], SAMPLE_RATE):
            voiced += 30
            end = i + _VAD_FRAME_BYTES
    return voiced, end


def voiced_ms(pcm: bytes, *, mode: int = 2) -> int:
    """Milliseconds of 30 ms frames WebRTC VAD calls speech."""
    return speech_extent(pcm, mode=mode)[0]


def _comfort_noise(samples: int) -> bytes:
    """Lead-in/out padding: without it the recogniser drops the first word; digital zeros
    made it drop it in ~1 of 5 fresh processes, ±4 LSB of seeded noise in none of 30."""
    rng = random.Random(0)  # deterministic padding, not a secret
    return array("h", (rng.randint(-4, 4) for _ in range(samples))).tobytes()


class PocketsphinxEngine:
    """Synchronous engine: ``transcribe(pcm, hints)``.

    Without hints: the stock en-us model. With hints: a small decoder whose dictionary and
    language model hold only the lesson's words plus the generic vocabulary (building it takes
    ~10 ms; loading an extra model into the full 130k-word decoder takes seconds).
    """

    name = "pocketsphinx"

    def __init__(self, *, lm_cache: int = 8, min_speech_ms: int = 120, pad_ms: int = 250) -> None:
        self._generic = Decoder(loglevel="FATAL")
        self._lm_cache = lm_cache
        self._min_speech_ms = min_speech_ms
        self._pad = _comfort_noise(SAMPLE_RATE * pad_ms // 1000)
        # hints → decoder; bounded LRU (overflow: least recently used lesson decoder dropped).
        self._lessons: OrderedDict[tuple[str, ...], Decoder] = OrderedDict()
        # One decoder per grammar, built at first use: bounded by the enum's members.
        self._grammars: dict[AnswerGrammar, Decoder] = {}

    def _known(self, word: str) -> bool:
        return self._generic.lookup_word(word) is not None

    def _decoder(self, hints: tuple[str, ...]) -> Decoder:
        if not hints:
            return self._generic
        decoder = self._lessons.get(hints)
        if decoder is None:
            arpa = lesson_arpa(hints, self._known)
            if arpa is None:
                return self._generic
            vocab = sorted({w for w in (*GENERIC_WORDS, *lesson_words(hints)) if self._known(w)})
            decoder = self._small_decoder("lm", arpa, vocab)
            self._lessons[hints] = decoder
            if len(self._lessons) > self._lm_cache:
                self._lessons.popitem(last=False)
        self._lessons.move_to_end(hints)
        return decoder

    def _small_decoder(
        self, kind: str, model: str, words: Iterable[str], **options: Any
    ) -> Decoder:
        """A decoder over ``words`` (pronunciations from the stock dictionary) with ``model``
        as its language model (``kind`` "lm": ARPA text) or grammar ("jsgf": JSGF text)."""
        with tempfile.TemporaryDirectory(prefix="snlpgw-asr-") as tmp:
            model_path = os.path.join(tmp, f"model.{kind}")
            dict_path = os.path.join(tmp, "words.dict")
            with open(model_path, "w", encoding="utf-8") as fh:
                fh.write(model)
            with open(dict_path, "w", encoding="utf-8") as fh:
                fh.writelines(f"{w} {self._generic.lookup_word(w)}\n" for w in words)
            return Decoder(loglevel="FATAL", dict=dict_path, **{kind: model_path}, **options)

    def _grammar_decoder(self, grammar: AnswerGrammar) -> Decoder:
        decoder = self._grammars.get(grammar)
        if decoder is None:
            jsgf = grammar_jsgf(grammar, self._known)
            words = grammar_words(grammar, self._known)
            decoder = self._small_decoder("jsgf", jsgf, words, **GRAMMAR_OPTIONS[grammar])
            self._grammars[grammar] = decoder
        return decoder

    def transcribe(
        self, pcm: bytes, hints: Sequence[str] = (), grammar: AnswerGrammar | None = None
    ) -> AsrResult | AsrFailure:
        """``grammar``: decode with that answer grammar (``hints`` unused); None: the lesson
        model from ``hints``, or the generic model without them."""
        bad = check_pcm(pcm)
        if bad is not None:
            return bad
        start = time.perf_counter()
        duration_ms = audio_ms(pcm)
        text = ""
        voiced, end = speech_extent(pcm)
        if voiced >= self._min_speech_ms:
            if grammar is not None:
                decoder = self._grammar_decoder(grammar)
                pcm = pcm[: end + SAMPLE_RATE * GRAMMAR_TAIL_MS // 1000 * SAMPLE_BYTES]
            else:
                decoder = self._decoder(tuple(hints))
            decoder.start_utt()
            decoder.process_raw(self._pad + pcm + self._pad, full_utt=True)
            decoder.end_utt()
            hyp = decoder.hyp()
            text = hyp.hypstr if hyp is not None else ""
        return AsrResult(
            text=text,
            engine=self.name,
            audio_ms=duration_ms,
            elapsed_ms=(time.perf_counter() - start) * 1000,
        )
