"""Answer grammars for the embedded recogniser: JSGF text and its word list (pure).

An inline number task knows the kind of answer it waits for (:class:`AnswerGrammar`). Searching
only that kind of answer costs pocketsphinx ~20-30 ms of CPU per answer instead of ~110 ms
with the lesson language model, and hears espeak-ng's numbers at least as well (measured:
bench/results/asr.md, docs/tasks.md).

A grammar makes the decoder pick the closest sentence it allows, so speech that is no number at
all would come out as one. Each grammar therefore also allows a few common non-answers
("i don't know", "again", "what", "yes", "no", ...): they carry no number, so the task's parser
finds none and its no-answer/wrong path runs. Speech outside the grammar and the non-answers
can still come out as the nearest allowed sentence (docs/tasks.md says so).

Words the pronunciation dictionary does not know are left out (``known``), with every
alternative that uses them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gateway.assessment.jobs import AnswerGrammar

NUMBER_WORDS: tuple[str, ...] = (
    *("zero", "one", "two", "three", "four", "five"),
    *("six", "seven", "eight", "nine", "ten"),
)
#: A digit sequence's words. No "oh" for zero: with it the decoder heard "no" as "oh" (a zero).
DIGIT_WORDS: tuple[str, ...] = NUMBER_WORDS[:10]
#: Short carriers a child may put before the number.
CARRIERS: tuple[str, ...] = ("it is", "it's", "the answer is", "i think it is", "is")
#: Common non-answers: in the grammar so that they do not become a number.
NON_ANSWERS: tuple[str, ...] = (
    "i don't know",
    "don't know",
    "i forgot",
    "again",
    "say it again",
    "repeat please",
    "what",
    "pardon",
    "yes",
    "no",
    "help",
)


def _alternatives(phrases: Iterable[str], known: Callable[[str], bool]) -> list[str]:
    return [p for p in phrases if all(known(w) for w in p.split())]


def _rule(name: str, phrases: list[str]) -> str:
    return f"<{name}> = {' | '.join(phrases)} ;"


def grammar_jsgf(grammar: AnswerGrammar, known: Callable[[str], bool]) -> str:
    """The JSGF grammar for ``grammar``: the answers it allows or one of the non-answers."""
    numbers = _alternatives(NUMBER_WORDS if grammar is AnswerGrammar.NUMBER else DIGIT_WORDS, known)
    if not numbers:
        raise ValueError("the dictionary knows none of the number words")
    rules = [_rule("number", numbers)]
    answer = "<number> +" if grammar is AnswerGrammar.DIGITS else "<number>"
    if grammar is AnswerGrammar.NUMBER and (carriers := _alternatives(CARRIERS, known)):
        rules.append(_rule("carrier", carriers))
        answer = "[ <carrier> ] <number>"
    alternatives = [answer]
    if non_answers := _alternatives(NON_ANSWERS, known):
        rules.append(_rule("nonanswer", non_answers))
        alternatives.append("<nonanswer>")
    head = [
        "#JSGF V1.0;",
        f"grammar snlp_{grammar.value};",
        f"public <answer> = {' | '.join(f'( {a} )' for a in alternatives)} ;",
    ]
    return "\n".join([*head, *rules]) + "\n"


def grammar_words(grammar: AnswerGrammar, known: Callable[[str], bool]) -> tuple[str, ...]:
    """Every word ``grammar_jsgf`` may use (the decoder's dictionary), sorted."""
    phrases = [
        *(NUMBER_WORDS if grammar is AnswerGrammar.NUMBER else DIGIT_WORDS),
        *(CARRIERS if grammar is AnswerGrammar.NUMBER else ()),
        *NON_ANSWERS,
    ]
    return tuple(sorted({w for p in _alternatives(phrases, known) for w in p.split()}))
