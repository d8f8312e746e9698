"""Numbers in a child's answer, from an ASR transcript (pure).

English number words ("seven", "twenty one"), Arabic numerals ("7", "21") and Chinese numerals
("七", "二十一", "两") are understood; Chinese runs go through ``cn2an`` (a maintained
converter). Two readings:

* :func:`spoken_numbers` — the numbers said, in order ("three plus four is seven" → 3, 4, 7);
* :func:`spoken_digits` — a digit sequence said digit by digit ("three five seven", "357",
  "三五七" → 3, 5, 7), for the reverse-digits task.
"""

from __future__ import annotations

import re

_UNITS = {
    "zero": 0,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "thirteen": 13,
    "fourteen": 14,
    "fifteen": 15,
    "sixteen": 16,
    "seventeen": 17,
    "eighteen": 18,
    "nineteen": 19,
}
_TENS = {
    "twenty": 20,
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "eighty": 80,
    "ninety": 90,
}
#: Said for a digit in a digit sequence ("oh" for zero, as in phone numbers).
_DIGIT_WORDS = {**{k: v for k, v in _UNITS.items() if v < 10}, "oh": 0}
_CN_DIGITS = {
    "零": 0,
    "〇": 0,
    "一": 1,
    "幺": 1,
    "二": 2,
    "两": 2,
    "三": 3,
    "四": 4,
    "五": 5,
    "六": 6,
    "七": 7,
    "八": 8,
    "九": 9,
}
_CN_NUMERAL = "零〇一幺二两三四五六七八九十百千万"
_TOKEN = re.compile(rf"[a-z]+|[0-9]+|[{_CN_NUMERAL}]+")
MAX_TOKENS = 64  # a transcript is short; a long one is cut, never walked whole


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower()[:1000])[:MAX_TOKENS]


def _chinese(run: str) -> int | None:
    # imported at the first Chinese answer: ~1 s that every gateway start would otherwise pay
    import cn2an  # noqa: PLC0415

    try:
        value = cn2an.cn2an(run.replace("幺", "一"), "smart")
    except (ValueError, KeyError, IndexError):
        return None
    return int(value) if float(value).is_integer() else None


def spoken_numbers(text: str) -> list[int]:
    """Every number said, in order; words that are not numbers are skipped."""
    out: list[int] = []
    tens: int | None = None  # "twenty" waiting for a unit ("twenty one")
    for token in _tokens(text):
        if token in _UNITS and tens is not None and 0 < _UNITS[token] < 10:
            out.append(tens + _UNITS[token])
            tens = None
            continue
        if tens is not None:
            out.append(tens)
            tens = None
        if token in _TENS:
            tens = _TENS[token]
        elif token in _UNITS:
            out.append(_UNITS[token])
        elif token.isdigit():
            out.append(int(token))
        elif token[0] in _CN_NUMERAL:
            value = _chinese(token)
            if value is not None:
                out.append(value)
    if tens is not None:
        out.append(tens)
    return out


def spoken_digits(text: str) -> list[int]:
    """The digits said one by one, in order (numbers over 9 are read digit by digit)."""
    out: list[int] = []
    for token in _tokens(text):
        if token in _DIGIT_WORDS:
            out.append(_DIGIT_WORDS[token])
        elif token.isdigit():
            out.extend(int(c) for c in token)
        elif token[0] in _CN_NUMERAL:
            out.extend(_CN_DIGITS[c] for c in token if c in _CN_DIGITS)
        elif token in _UNITS or token in _TENS:
            out.extend(int(c) for c in str(_UNITS.get(token, _TENS.get(token))))
    return out
