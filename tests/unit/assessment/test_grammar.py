"""The answer grammars' JSGF text and word lists (pure; the dictionary is a stand-in set)."""

from __future__ import annotations

import re

import pytest

from gateway.assessment.grammar import (
    CARRIERS,
    DIGIT_WORDS,
    NON_ANSWERS,
    NUMBER_WORDS,
    grammar_jsgf,
    grammar_words,
)
from gateway.assessment.jobs import AnswerGrammar
from gateway.tasks.dsl.numbers import spoken_digits, spoken_numbers

EVERY_WORD = {w for p in (*NUMBER_WORDS, *DIGIT_WORDS, *CARRIERS, *NON_ANSWERS) for w in p.split()}


def knows_all(word: str) -> bool:
    return word in EVERY_WORD


def rules(jsgf: str) -> dict[str, list[str]]:
    found = re.findall(r"^(?:public )?<(\w+)> = (.*) ;$", jsgf, re.MULTILINE)
    return {name: [a.strip() for a in body.split("|")] for name, body in found}


def test_the_number_grammar_allows_a_number_after_an_optional_carrier_or_a_non_answer() -> None:
    jsgf = grammar_jsgf(AnswerGrammar.NUMBER, knows_all)
    assert jsgf.startswith("#JSGF V1.0;\ngrammar snlp_number;\n")
    got = rules(jsgf)
    assert got["answer"] == ["( [ <carrier> ] <number> )", "( <nonanswer> )"]
    assert got["number"] == list(NUMBER_WORDS)
    assert got["number"][0] == "zero"
    assert got["number"][-1] == "ten"
    assert got["carrier"] == list(CARRIERS)
    assert got["nonanswer"] == list(NON_ANSWERS)


def test_the_digit_grammar_allows_one_or_more_digits_and_no_carrier() -> None:
    got = rules(grammar_jsgf(AnswerGrammar.DIGITS, knows_all))
    assert got["answer"] == ["( <number> + )", "( <nonanswer> )"]
    assert got["number"] == list(DIGIT_WORDS)
    assert "ten" not in got["number"]
    assert "oh" not in got["number"]  # "no" was heard as "oh": a zero
    assert "carrier" not in got


@pytest.mark.parametrize("grammar", list(AnswerGrammar))
def test_the_words_are_exactly_those_the_grammar_uses(grammar: AnswerGrammar) -> None:
    got = rules(grammar_jsgf(grammar, knows_all))
    used = {
        w
        for name in ("number", "carrier", "nonanswer")
        for p in got.get(name, [])
        for w in p.split()
    }
    assert set(grammar_words(grammar, knows_all)) == used
    assert list(grammar_words(grammar, knows_all)) == sorted(used)


def test_unknown_words_drop_their_alternatives() -> None:
    def known(word: str) -> bool:
        return knows_all(word) and word not in {"don't", "answer", "seven"}

    got = rules(grammar_jsgf(AnswerGrammar.NUMBER, known))
    assert "seven" not in got["number"]
    assert "the answer is" not in got["carrier"]
    assert not any("don't" in p for p in got["nonanswer"])
    assert "don't" not in grammar_words(AnswerGrammar.NUMBER, known)


def test_without_carriers_or_non_answers_only_the_numbers_remain() -> None:
    def numbers_only(word: str) -> bool:
        return word in NUMBER_WORDS

    got = rules(grammar_jsgf(AnswerGrammar.NUMBER, numbers_only))
    assert got["answer"] == ["( <number> )"]
    assert set(got) == {"answer", "number"}


def test_a_dictionary_without_numbers_is_an_error() -> None:
    with pytest.raises(ValueError, match="none of the number words"):
        grammar_jsgf(AnswerGrammar.DIGITS, lambda _w: False)


def test_no_non_answer_holds_a_number_and_every_number_parses() -> None:
    for phrase in NON_ANSWERS:
        assert spoken_numbers(phrase) == [], phrase
        assert spoken_digits(phrase) == [], phrase
    assert [spoken_numbers(w) for w in NUMBER_WORDS] == [[n] for n in range(11)]
    assert [spoken_digits(w) for w in DIGIT_WORDS] == [[n] for n in range(10)]
    for carrier in CARRIERS:
        assert spoken_numbers(f"{carrier} seven") == [7]
