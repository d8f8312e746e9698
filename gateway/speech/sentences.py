"""Text → the sentences SPEAK synthesises and announces one by one (pure).

The firmware shows each ``sentence_start`` text as it comes; synthesising sentence by sentence
also lets the first one play while the next is made (a long feedback line starts sooner), and
the phrase cache keeps the sentences a lesson repeats. A sentence ends after ``.``, ``!``,
``?`` or ``;`` followed by a space (so "3.5" stays whole), after the CJK full stop,
exclamation, question mark or semicolon, and at a line break; pieces are stripped and empty
ones dropped.
"""

from __future__ import annotations

import re

_END = re.compile(r"(?<=[.!?;])\s+|(?<=[。！？；])|\n+")  # noqa: RUF001 - CJK sentence ends


def sentences(text: str) -> list[str]:
    """The sentences of ``text`` in order (none for blank text)."""
    return [piece.strip() for piece in _END.split(text) if piece.strip()]
