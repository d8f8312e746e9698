"""A small per-lesson language model for the embedded recogniser.

The stock en-us n-gram model is too weak for short children's sentences (on espeak-ng speech
it hears "Good morning." as "org"). When the job carries its lesson's sentences, we build an
ARPA back-off model from *all* of them plus a generic vocabulary of common English words as
unigrams. The model never knows which sentence is expected; it only makes the lesson's words
likely. Speech outside the lesson still decodes as some other word string, so a wrong sentence
yields wrong text and a low similarity (measured in tests/integration/test_asr_speech.py).
The price: words outside lesson + generic vocabulary cannot be transcribed exactly.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterable

from pocketsphinx.lm import ArpaBoLM

# Discount mass of the back-off model: lower trusts lesson n-grams more. 0.3 decodes all demo
# sentences exactly on espeak-ng speech while unrelated speech stays unrelated.
DISCOUNT_MASS = 0.3

# Common English words for young learners (sight words, everyday nouns and verbs): the generic
# fallback that lets the model transcribe something other than the lesson.
_GENERIC = """
    a about after again all always am an and any apple are around as ask at ate away baby back
    bad ball be because bed been before best big bird black blue book both boy bread bring
    brother brown bus but buy by cake call came can car cat chair children clean cold come could
    cow cut day did do does dog done door down draw drink eat eight every fall far fast find
    fine first fish five fly for found four friend from full funny gave get girl give go goes
    going good got green grow had has have he hello help her here him his hold home hot house
    how hurt i if in into is it its jump just keep kind know laugh let light like little live
    long look made make man many may me milk mother much must my myself never new nice night no
    not now of off old on once one only open or our out over own pick play please pretty pull
    put ran read red ride right round run said saw say school see seven shall she show sing
    sister sit six sleep small so some soon start stop sun table take tell ten thank that the
    their them then there these they think this those three to today together too tree try two
    under up upon us use very walk want warm was wash water we well went were what when where
    which white who why will window wish with work would write yellow yes you your zoo morning
    evening afternoon name teacher
"""
GENERIC_WORDS: tuple[str, ...] = tuple(_GENERIC.split())

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def words(text: str) -> list[str]:
    """Lower-case English word tokens; everything else (punctuation, CJK) is ignored."""
    return _WORD.findall(text.lower())


def lesson_words(sentences: Iterable[str]) -> list[str]:
    return [w for s in sentences for w in words(s)]


def lesson_arpa(
    sentences: Iterable[str],
    known: Callable[[str], bool],
    *,
    generic: Iterable[str] = GENERIC_WORDS,
) -> str | None:
    """ARPA text for the lesson, or ``None`` when no sentence has a word the dictionary knows.

    ``known`` tells whether the pronunciation dictionary has a word; unknown words are left out
    (the decoder cannot use them).
    """
    lines = [" ".join(w for w in words(s) if known(w)) for s in sentences]
    corpus = "\n".join(line for line in lines if line)
    if not corpus:
        return None
    model = ArpaBoLM(add_start=True, discount_mass=DISCOUNT_MASS)
    model.read_corpus(io.StringIO(corpus))
    for word in generic:
        if known(word) and word not in model.grams_1:
            model.grams_1[word] = 1  # same as ArpaBoLM.read_word_file with count 1
    model.compute()
    out = io.StringIO()
    model.write(out)
    return out.getvalue()
