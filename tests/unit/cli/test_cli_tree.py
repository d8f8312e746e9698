"""The ``snlpgw`` command tree: every sub-command is registered, answers ``--help`` and names a
handler (``args.func``), wherever its domain lives."""

from __future__ import annotations

import argparse

import pytest

from gateway.cli.main import build_parser, main

EXPECTED = {
    ("run",),
    ("dev-run",),
    ("broker", "init"),
    ("provision",),
    ("device", "approve"),
    ("device", "pending"),
    ("device", "list"),
    ("device", "rotate"),
    ("device", "forget"),
    ("doctor",),
    ("catalog", "check"),
    ("catalog", "reload"),
    ("lesson", "start"),
    ("lesson", "pause"),
    ("lesson", "resume"),
    ("lesson", "stop"),
    ("lesson", "sync"),
    ("simulate", "board"),
    ("simulate", "xiaozhi"),
    ("user", "add"),
    ("user", "passwd"),
    ("user", "remove"),
    ("asr-serve",),
    ("reassess",),
}


def leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {path: parser}
    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for name, child in subs[0].choices.items():
        found |= leaves(child, (*path, name))
    return found


def test_every_sub_command_is_registered() -> None:
    assert set(leaves(build_parser())) == EXPECTED


@pytest.mark.parametrize("path", sorted(EXPECTED))
def test_every_sub_command_answers_help(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main([*path, "--help"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: snlpgw {' '.join(path)}")


@pytest.mark.parametrize("path", sorted(EXPECTED))
def test_every_sub_command_has_a_handler(path: tuple[str, ...]) -> None:
    assert callable(leaves(build_parser())[path].get_default("func"))
