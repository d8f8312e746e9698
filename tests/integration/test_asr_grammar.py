"""Grammar-constrained recognition on real speech (espeak-ng) through the embedded engine in a
real worker process: the job's :class:`AnswerGrammar` crosses the process boundary and the
engine decodes with its JSGF decoder.

Numbers 0-10 said as "it is <n>" (the DSL tests' child, 700 ms of silence after) are heard as
that number, except the three pocketsphinx mishears in espeak-ng speech (one, six, nine: see
tests/integration/test_dsl_tasks.py); the grammar gets at least as many of the eleven right as
the lesson language model on the same audio; digit sequences come back digit for digit; and the
common non-answers come back as themselves, with no number in them, so the task's parser sees
no answer.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from gateway.assessment.grammar import NON_ANSWERS
from gateway.assessment.jobs import AnswerGrammar, AsrJob, AsrKey, AsrOutcome, AsrResult
from gateway.assessment.procslot import ProcessBackend
from gateway.assessment.sphinx import PocketsphinxEngine
from gateway.tasks.dsl.exercises import (
    NUMBER_HINTS,
    ArithmeticWithinTen,
    Question,
    ReverseDigits,
)
from gateway.tasks.dsl.numbers import spoken_digits, spoken_numbers
from tests.support.speech import silence, synthesize
from tests.unit.assessment.harness import running_pool

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
MISHEARD = {1, 6, 9}  # espeak-ng's "one", "six", "nine" (docs/tasks.md)
# Not "three five seven": espeak-ng's "seven" at the end of a sequence comes back as "two one"
# (the lesson LM hears "zoo one"); docs/tasks.md.
DIGIT_SEQUENCES = (
    "seven zero four two",
    "two four",
    "five three zero",
    "seven five zero five zero four",
)
SAID_NON_ANSWERS = ("i don't know", "again", "what", "yes", "no", "say it again")
TAIL_MS = 700

Said = tuple[str, AnswerGrammar | None]  # the text spoken, and the grammar (None: hint LM)


def _plan() -> list[Said]:
    numbers = [f"it is {w}" for w in WORDS]
    return [
        *((t, AnswerGrammar.NUMBER) for t in numbers),
        *((t, None) for t in numbers),  # the same audio with the lesson LM (today's path)
        *((t, AnswerGrammar.DIGITS) for t in DIGIT_SEQUENCES),
        *((t, AnswerGrammar.NUMBER) for t in SAID_NON_ANSWERS),
        *((t, AnswerGrammar.DIGITS) for t in SAID_NON_ANSWERS),
    ]


async def _transcribe_all(plan: list[Said]) -> dict[Said, str]:
    heard: dict[Said, str] = {}
    backend = ProcessBackend(PocketsphinxEngine, name="pocketsphinx")
    async with running_pool(backend, queue_limit=len(plan)) as c:
        for step, (text, grammar) in enumerate(plan):
            pcm = synthesize(text) + silence(TAIL_MS)
            hints = () if grammar else NUMBER_HINTS
            c.pool.submit(AsrJob(AsrKey("grammar", step, "u"), pcm, hints, grammar))
        for _ in plan:
            out: AsrOutcome = await c.next(120)
            assert isinstance(out.result, AsrResult), out
            heard[plan[out.key.step_index]] = out.result.text
    return heard


@pytest.fixture(scope="module")
def heard() -> dict[Said, str]:
    """Transcribed once per module, through the real pool, on a loop of its own."""
    return asyncio.run(_transcribe_all(_plan()))


@pytest.mark.parametrize("n", [n for n in range(11) if n not in MISHEARD])
def test_a_number_answer_is_heard_as_that_number(heard: dict[Said, str], n: int) -> None:
    text = heard[(f"it is {WORDS[n]}", AnswerGrammar.NUMBER)]
    assert text == f"it is {WORDS[n]}"
    exercise = ArithmeticWithinTen("en", random.Random(0))
    assert exercise.reply(Question("?", str(n)), text).metrics["correct"] == 1.0


def test_the_grammar_hears_as_many_numbers_as_the_lesson_model(heard: dict[Said, str]) -> None:
    def right(grammar: AnswerGrammar | None) -> list[int]:
        return [
            n
            for n in range(11)
            if spoken_numbers(heard[(f"it is {WORDS[n]}", grammar)])[-1:] == [n]
        ]

    with_grammar, with_lm = right(AnswerGrammar.NUMBER), right(None)
    assert len(with_grammar) >= len(with_lm), (with_grammar, with_lm)


@pytest.mark.parametrize("sequence", DIGIT_SEQUENCES)
def test_a_digit_sequence_is_heard_digit_for_digit(heard: dict[Said, str], sequence: str) -> None:
    text = heard[(sequence, AnswerGrammar.DIGITS)]
    assert text == sequence
    digits = [WORDS.index(w) for w in sequence.split()]
    exercise = ReverseDigits("en", random.Random(0), length=len(digits))
    reply = exercise.reply(Question("?", " ".join(map(str, digits))), text)
    assert reply.metrics["position_accuracy"] == 1.0


@pytest.mark.parametrize("grammar", list(AnswerGrammar))
@pytest.mark.parametrize("said", SAID_NON_ANSWERS)
def test_a_non_answer_is_no_number(
    heard: dict[Said, str], said: str, grammar: AnswerGrammar
) -> None:
    text = heard[(said, grammar)]
    assert text in NON_ANSWERS
    assert spoken_numbers(text) == []
    assert spoken_digits(text) == []
    # the task's existing no-answer path: not answered, the right answer said back
    exercise = ArithmeticWithinTen("en", random.Random(0))
    reply = exercise.reply(Question("What is 2 plus 3?", "5"), text)
    assert reply.metrics == {"correct": 0.0, "answered": 0.0}
    assert reply.feedback == "It is 5."
