"""Answer parsers and question generators of the three shipped tasks (pure, seeded)."""

from __future__ import annotations

import random

import pytest

from gateway.assessment.jobs import AnswerGrammar
from gateway.tasks.core.steps import GeneratorDef
from gateway.tasks.dsl.exercises import (
    DIGIT_HINTS,
    NUMBER_HINTS,
    ArithmeticWithinTen,
    IdiomChain,
    IdiomLexicon,
    Question,
    ReverseDigits,
    chains,
    exercise_grammar,
    exercise_hints,
    idiom_lexicon,
    make_exercise,
)
from gateway.tasks.dsl.numbers import spoken_digits, spoken_numbers
from tests.support.verdicts import verdict_keys


@pytest.mark.parametrize(
    ("text", "numbers"),
    [
        ("seven", [7]),
        ("three plus four is seven", [3, 4, 7]),
        ("twenty one", [21]),
        ("twenty", [20]),
        ("ninety two ten", [92, 10]),
        ("twenty twenty", [20, 20]),
        ("it is 10", [10]),
        ("Ten!", [10]),
        ("七", [7]),
        ("答案是两", [2]),
        ("二十一", [21]),
        ("十", [10]),
        ("零", [0]),
        ("I don't know", []),
        ("", []),
    ],
)
def test_spoken_numbers(text: str, numbers: list[int]) -> None:
    assert spoken_numbers(text) == numbers


@pytest.mark.parametrize(
    ("text", "digits"),
    [
        ("three five seven", [3, 5, 7]),
        ("357", [3, 5, 7]),
        ("三五七", [3, 5, 7]),
        ("一 二 三", [1, 2, 3]),
        ("幺两零", [1, 2, 0]),
        ("oh one nine", [0, 1, 9]),
        ("twelve", [1, 2]),
        ("twenty", [2, 0]),
        ("um seven uh four", [7, 4]),
        ("hello", []),
    ],
)
def test_spoken_digits(text: str, digits: list[int]) -> None:
    assert spoken_digits(text) == digits


def test_a_long_transcript_is_cut_not_walked_whole() -> None:
    assert len(spoken_numbers("one " * 10_000)) == 64


def test_a_chinese_run_cn2an_refuses_is_skipped() -> None:
    assert spoken_numbers("十十 five") == [5]


# -- reverse digits -------------------------------------------------------------------------
def test_reverse_digits_adapts_its_length_within_bounds() -> None:
    ex = ReverseDigits("en", random.Random(1), length=3, min_length=3, max_length=6)
    lengths = []
    for _ in range(6):  # every answer right: 3 4 5 6 6 6
        q = ex.question()
        lengths.append(len(q.expected.split()))
        reply = ex.reply(q, q.expected)
        assert reply.metrics["position_accuracy"] == 1.0
        assert reply.feedback.startswith("Yes!")
    assert lengths == [3, 4, 5, 6, 6, 6]
    for _ in range(5):  # nothing right: back down to 3, not below
        q = ex.question()
        ex.reply(q, None)
    assert len(ex.question().expected.split()) == 3


def test_reverse_digits_scores_each_position() -> None:
    ex = ReverseDigits("en", random.Random(0), length=4, min_length=3, max_length=6)
    q = Question("Say these backwards: 1, 2, 3, 4.", "4 3 2 1")
    reply = ex.reply(q, "four three one")
    assert reply.metrics == {
        "position_accuracy": 0.5,
        "digit_count": 4.0,
        "answered": 1.0,
        "position_1": 1.0,
        "position_2": 1.0,
        "position_3": 0.0,
        "position_4": 0.0,
    }
    assert reply.feedback == "It was 4, 3, 2, 1."
    assert ex.length == 4  # partly right: the length stays
    assert not verdict_keys(dict(reply.metrics))


def test_reverse_digits_in_chinese() -> None:
    ex = ReverseDigits("zh", random.Random(2), length=3, min_length=3, max_length=6)
    q = ex.question()
    assert q.text.startswith("倒着说：")
    said = "".join("零一二三四五六七八九"[int(d)] for d in q.expected.split())
    assert ex.reply(q, said).feedback.startswith("对了！")
    assert ex.reply(q, "").feedback.startswith("答案是")
    assert ex.neutral() == "我们来做下一题。"


# -- arithmetic -----------------------------------------------------------------------------
def test_arithmetic_asks_distinct_questions_with_results_0_to_10() -> None:
    ex = ArithmeticWithinTen("en", random.Random(7))
    asked = [ex.question() for _ in range(110)]
    assert len({q.text for q in asked}) == 110
    for q in asked:
        words = q.text.removeprefix("What is ").rstrip("?").split()
        a, op, b = int(words[0]), words[1], int(words[2])
        result = a + b if op == "plus" else a - b
        assert 0 <= a <= 10
        assert 0 <= b <= 10
        assert 0 <= result <= 10
        assert q.expected == str(result)


def test_arithmetic_starts_over_after_every_question_was_asked() -> None:
    ex = ArithmeticWithinTen("en", random.Random(7))
    asked = [ex.question().text for _ in range(130)]  # 55 sums and 55 differences, then again
    assert len(set(asked)) == len(set(asked[:110])) == 110


@pytest.mark.parametrize(
    ("text", "correct", "answered", "feedback"),
    [
        ("seven", 1.0, 1.0, "Right!"),
        ("7", 1.0, 1.0, "Right!"),
        ("I think it is seven", 1.0, 1.0, "Right!"),
        ("six", 0.0, 1.0, "It is 7."),
        ("banana", 0.0, 0.0, "It is 7."),
        (None, 0.0, 0.0, "It is 7."),
    ],
)
def test_arithmetic_parses_the_answer(
    text: str | None, correct: float, answered: float, feedback: str
) -> None:
    ex = ArithmeticWithinTen("en", random.Random(1))
    reply = ex.reply(Question("What is 3 plus 4?", "7"), text)
    assert reply.metrics == {"correct": correct, "answered": answered}
    assert reply.feedback == feedback


def test_arithmetic_in_chinese() -> None:
    ex = ArithmeticWithinTen("zh", random.Random(1))
    q = ex.question()
    assert q.text.endswith("等于几？")
    assert ("加" in q.text) or ("减" in q.text)
    assert ex.reply(Question("三加四等于几？", "7"), "等于七").metrics["correct"] == 1.0
    assert ex.reply(Question("三加四等于几？", "7"), "六").feedback == "答案是7。"
    assert ex.reply(Question("三加四等于几？", "7"), "七").feedback == "对，是7。"
    assert ex.neutral() == "我们来做下一题。"
    assert ArithmeticWithinTen("en", random.Random(1)).neutral() == "Let's go on to the next one."


# -- idiom chain ----------------------------------------------------------------------------
SMALL = IdiomLexicon.of(["一心一意", "意气风发", "发扬光大", "大公无私", "私心杂念"])


def test_the_lexicon_is_the_maintained_package() -> None:
    lexicon = idiom_lexicon()
    assert len(lexicon.idioms) > 29_000
    assert lexicon.find("守株待兔") == "守株待兔"


def test_find_accepts_homophones_and_surrounding_words() -> None:
    assert SMALL.find("我说意气风发") == "意气风发"
    assert SMALL.find("易气风发") == "意气风发"  # 易 sounds like 意
    assert SMALL.find("你好世界") is None
    assert SMALL.find("hello") is None


def test_chains_by_sound() -> None:
    assert chains("一心一意", "意气风发")
    assert chains("一心一意", "异想天开")  # 异 yi = 意 yi
    assert not chains("一心一意", "发扬光大")


def test_idiom_chain_answers_with_the_next_idiom() -> None:
    ex = IdiomChain("zh", random.Random(0), SMALL, current="一心一意", used={"一心一意"})
    q = ex.question()
    assert q.text == "一心一意。请接：意。"
    reply = ex.reply(q, "意气风发")
    assert reply.metrics == {"answered": 1.0, "is_idiom": 1.0, "chained": 1.0}
    assert reply.feedback == "意气风发，接得好！我接：发扬光大。"
    assert ex.question().text.startswith("发扬光大")


@pytest.mark.parametrize(
    ("text", "metrics"),
    [
        ("你好世界", {"answered": 1.0, "is_idiom": 0.0, "chained": 0.0}),
        ("大公无私", {"answered": 1.0, "is_idiom": 1.0, "chained": 0.0}),
        ("一心一意", {"answered": 1.0, "is_idiom": 1.0, "chained": 0.0}),  # already said
        (None, {"answered": 0.0, "is_idiom": 0.0, "chained": 0.0}),
    ],
)
def test_idiom_chain_hints_when_the_answer_does_not_chain(
    text: str | None, metrics: dict[str, float]
) -> None:
    ex = IdiomChain(
        "zh", random.Random(0), SMALL, current="意气风发", used={"意气风发", "一心一意"}
    )
    reply = ex.reply(ex.question(), text)
    assert reply.metrics == metrics
    assert reply.feedback == "提示：想一个“发”字开头的成语。"
    assert ex.current == "意气风发"


def test_idiom_chain_starts_over_at_a_dead_end() -> None:
    ex = IdiomChain("zh", random.Random(0), SMALL, current="大公无私", used={"大公无私"})
    reply = ex.reply(ex.question(), "私心杂念")
    assert reply.feedback == "私心杂念，接得好！我们换一个。"
    q = ex.question()  # a new idiom drawn from those not yet said
    assert q.text[:4] in {"一心一意", "意气风发", "发扬光大"}
    assert ex.neutral() == "我们继续。"


def test_make_exercise_builds_each_kind() -> None:
    rd = make_exercise(GeneratorDef(kind="reverse_digits", start_length=4, max_length=5), 3)
    assert isinstance(rd, ReverseDigits)
    assert (rd.length, rd.min_length, rd.max_length) == (4, 4, 5)
    assert isinstance(make_exercise(GeneratorDef(kind="arithmetic_10"), 3), ArithmeticWithinTen)
    chain = make_exercise(GeneratorDef(kind="idiom_chain", seed_idiom="一心一意"), 3)
    assert isinstance(chain, IdiomChain)
    assert chain.question().text.startswith("一心一意")
    drawn = make_exercise(GeneratorDef(kind="idiom_chain"), 3)
    assert len(drawn.question().text.split("。")[0]) == 4
    # The same seed asks the same questions.
    a = make_exercise(GeneratorDef(kind="arithmetic_10"), 9)
    b = make_exercise(GeneratorDef(kind="arithmetic_10"), 9)
    assert [a.question() for _ in range(5)] == [b.question() for _ in range(5)]


def test_number_tasks_hint_the_recogniser_with_number_words() -> None:
    assert "seven" in exercise_hints(GeneratorDef(kind="arithmetic_10"))
    assert exercise_hints(GeneratorDef(kind="reverse_digits")) == DIGIT_HINTS
    assert "it is" not in " ".join(DIGIT_HINTS)
    assert NUMBER_HINTS != DIGIT_HINTS
    assert exercise_hints(GeneratorDef(kind="idiom_chain")) == ()


def test_english_number_tasks_name_their_answer_grammar() -> None:
    assert exercise_grammar(GeneratorDef(kind="arithmetic_10")) is AnswerGrammar.NUMBER
    assert exercise_grammar(GeneratorDef(kind="reverse_digits")) is AnswerGrammar.DIGITS
    assert exercise_grammar(GeneratorDef(kind="arithmetic_10", voice="zh")) is None  # English
    assert exercise_grammar(GeneratorDef(kind="reverse_digits", voice="zh")) is None
    assert exercise_grammar(GeneratorDef(kind="idiom_chain", voice="zh")) is None
    assert exercise_grammar(GeneratorDef(kind="idiom_chain")) is None


@pytest.mark.parametrize("text", ["i don't know", "again", "what", "yes", "no", "it is", ""])
def test_a_non_answer_of_the_grammar_has_no_number_so_it_is_not_right(text: str) -> None:
    exercise = ArithmeticWithinTen("en", random.Random(1))
    question = exercise.question()
    reply = exercise.reply(question, text)
    assert reply.metrics == {"correct": 0.0, "answered": 0.0}
    assert reply.feedback == f"It is {question.expected}."
    digits = ReverseDigits("en", random.Random(1))
    asked = digits.question()
    assert digits.reply(asked, text).metrics["answered"] == 0.0
