"""The broker room's pure rules (gateway/broker/rules.py, 100 % branch-gated): what the
credential-file tests next door do not reach through the files."""

from __future__ import annotations

from gateway.broker.rules import parse_passwd, render_passwd


def test_passwd_parsing_skips_blank_comment_and_colonless_lines() -> None:
    text = "\n# a comment: with a colon\nbroken-line\n  u2:$7$hash-2  \nu1:$7$hash:1\n"
    entries = parse_passwd(text)
    assert entries == {"u2": "$7$hash-2", "u1": "$7$hash:1"}  # a hash may hold a colon
    assert render_passwd(entries) == "u1:$7$hash:1\nu2:$7$hash-2\n"
