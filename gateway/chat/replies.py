"""The embedded engine's replies: a few rules and templates, no model (pure).

Offline CHAT must answer something sensible on this machine with no network: greet, tell the
time, say its name, decline gracefully, echo what it heard otherwise. ``PHRASES`` doubles as
the ASR hint list (pocketsphinx builds its language model from the hints, so the phrases the
rules know are the ones it recognises best). Replies never carry a verdict or a score.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gateway.tasks.core.rules import normalise

PHRASES: tuple[str, ...] = (
    "hello",
    "hi there",
    "good morning",
    "what time is it",
    "what is your name",
    "tell me a story",
    "thank you",
    "start the lesson",
    "goodbye",
)


@dataclass(frozen=True, slots=True)
class Reply:
    text: str
    end_session: bool = False  # say it, then standby
    start_task: bool = False  # say it, then start the voice task (priority 1)


GREETING_EN = "Hello! What can I do for you?"
GREETING_ZH = "你好，有什么事儿吗？"  # noqa: RUF001 - Chinese punctuation; voice-session v1 §1.2
_ZH_VOICES = ("cmn", "zh", "yue")


def greeting(voice: str) -> str:
    """What the embedded engine says when a session's first listen begins, in the language of
    its espeak-ng voice (the gateway is not told the device's own language)."""
    return GREETING_ZH if voice.lower().startswith(_ZH_VOICES) else GREETING_EN


def reply_to(heard: str | None, now: datetime) -> Reply:  # noqa: PLR0911 - one rule per return
    """What the embedded engine says to ``heard`` (``None``: recognition failed)."""
    said = normalise(heard or "")
    if not said:
        return Reply("Sorry, I did not catch that. Please say it again.")
    if "lesson" in said and ("start" in said or "begin" in said):
        return Reply("Okay, let us start the lesson.", start_task=True)
    if "bye" in said or "再见" in said:
        return Reply("Goodbye! Talk to you soon.", end_session=True)
    if "time" in said or "几点" in said:
        return Reply(f"It is {now.hour} {now.minute:02d}.")
    if "name" in said or "你是谁" in said:
        return Reply("I am your learning speaker.")
    if "story" in said:
        return Reply("Once upon a time, a little fox learned a new word every day.")
    if "thank" in said or "谢谢" in said:
        return Reply("You are welcome!")
    if any(word in said for word in ("hello", "hi", "morning", "你好")):
        return Reply("Hello! Nice to hear you.")
    return Reply(f"You said: {heard}.")
