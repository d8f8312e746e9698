"""ASR engines for integration tests: the real pocketsphinx engine with a fault injected.

They run in the pool's spawned worker processes, so they are importable, picklable classes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from gateway.assessment.jobs import AnswerGrammar, AsrFailure, AsrResult
from gateway.assessment.sphinx import PocketsphinxEngine

RAISE_ON = "later"  # the engine raises on any utterance it hears this word in


class RaisingEngine(PocketsphinxEngine):
    """Transcribes for real, then raises when the text contains ``RAISE_ON``."""

    def transcribe(
        self, pcm: bytes, hints: Sequence[str] = (), grammar: AnswerGrammar | None = None
    ) -> AsrResult | AsrFailure:
        result = super().transcribe(pcm, hints, grammar)
        if isinstance(result, AsrResult) and RAISE_ON in result.text.split():
            raise RuntimeError("injected ASR engine failure")
        return result


class SlowSphinxEngine(PocketsphinxEngine):
    """Transcribes for real, 5 s per job."""

    delay_s = 5.0

    def transcribe(
        self, pcm: bytes, hints: Sequence[str] = (), grammar: AnswerGrammar | None = None
    ) -> AsrResult | AsrFailure:
        time.sleep(self.delay_s)
        return super().transcribe(pcm, hints, grammar)


class SecondEngine(SlowSphinxEngine):
    """Transcribes for real, 1 s per job (to hold a job in flight)."""

    delay_s = 1.0
