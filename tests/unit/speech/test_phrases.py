"""The catalog's phrases SPEAK prepares ahead of use (gateway/speech/phrases.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import cast

from gateway.app import prepare_phrases
from gateway.speech.phrases import catalog_phrases
from gateway.speech.sentences import sentences
from gateway.speech.service import SpeechService
from gateway.tasks.catalog_live import LiveCatalog
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


class PreparingSpeech:
    """What ``prepare_phrases`` uses of SPEAK: its engine's voices and ``prepare``."""

    def __init__(self) -> None:
        self.engine = self
        self.calls: list[list[tuple[str, str]]] = []

    def voices(self) -> frozenset[str]:
        return frozenset({"en", "zh"})

    def prepare(self, phrases: list[tuple[str, str]]) -> None:
        self.calls.append(phrases)


def test_the_gateway_prepares_at_start_and_again_after_a_catalog_reload(tmp_path: Path) -> None:
    root = tmp_path / "catalog"
    shutil.copytree(REPO / "catalog", root)
    catalog, _ = LiveCatalog.load(root)
    speech = PreparingSpeech()
    prepare_phrases(cast("SpeechService", speech), catalog)
    assert len(speech.calls) == 1
    assert ("en", "Ten questions.") in speech.calls[0]
    file = root / "thinking_games.json"
    file.write_text(file.read_text().replace("Ten questions.", "Ten sums."))
    catalog.swap(load_catalog(root))
    assert len(speech.calls) == 2
    assert ("en", "Ten sums.") in speech.calls[1]
    assert ("en", "Ten questions.") not in speech.calls[1]
