"""The catalog's phrases SPEAK prepares ahead of use (gateway/speech/phrases.py)."""

from __future__ import annotations

from pathlib import Path

from gateway.speech.phrases import catalog_phrases
from gateway.speech.sentences import sentences
from gateway.tasks.core.loader import load_catalog
from gateway.tasks.core.steps import GeneratorDef
from gateway.tasks.dsl.exercises import exercise_phrases

REPO = Path(__file__).resolve().parents[3]


def test_the_shipped_catalog_phrases_are_sentences_in_order_each_once() -> None:
    tasks = load_catalog(REPO / "catalog").catalog
    phrases = catalog_phrases(tasks, frozenset({"en", "zh"}))
    assert len(phrases) == len(set(phrases))
    texts = [t for _, t in phrases]
    # speak steps, split as SPEAK splits them
    assert ("en", "Ten questions.") in phrases
    assert ("en", "Say the answer.") in phrases
    assert ("zh", "我们来玩成语接龙。") in phrases
    # a generator's lines, in its voice (the idiom chain's is always Mandarin)
    assert ("en", "What is 3 plus 4?") in phrases
    assert ("en", "Right!") in phrases
    assert ("zh", "我们继续。") in phrases
    assert all(sentences(t) == [t] for t in texts)
    arithmetic = exercise_phrases(GeneratorDef(kind="arithmetic_10"))
    assert set(arithmetic) <= set(texts)


def test_phrases_in_a_voice_the_engine_lacks_are_left_out() -> None:
    tasks = load_catalog(REPO / "catalog").catalog
    phrases = catalog_phrases(tasks, frozenset({"en"}))
    assert phrases
    assert {v for v, _ in phrases} == {"en"}
