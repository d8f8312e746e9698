"""`snlpgw simulate board` argument parsing and clip durations (no broker needed)."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest

from gateway.simulators.board import _parse_durations, add_board_simulator_command, clip_duration_ms


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="snlpgw")
    simulate = root.add_subparsers(dest="command").add_parser("simulate")
    add_board_simulator_command(simulate.add_subparsers(dest="device", required=True))
    return root


def test_board_command_options() -> None:
    args = parser().parse_args(
        [
            "simulate",
            "board",
            "aa_bb_cc_dd_ee_ff",
            "--url",
            "mqtt://127.0.0.1:1999",
            "--password",
            "pw",
            "--legacy",
            "--drop-acks",
            "2",
            "--no-lwt",
            "--duration",
            "a/01.mp3=2140",
            "--heartbeat-s",
            "0.3",
        ]
    )
    assert args.device_id == "aa_bb_cc_dd_ee_ff"
    assert (args.legacy, args.drop_acks, args.no_lwt, args.heartbeat_s) == (True, 2, True, 0.3)
    assert _parse_durations(args.duration) == {"a/01.mp3": 2140}
    assert callable(args.func)


@pytest.mark.parametrize("bad", ["nodigits=abc", "=12", "noequals"])
def test_bad_duration_is_refused(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        _parse_durations([bad])


def test_clip_duration_from_wav_header_and_sox(tmp_path: Path) -> None:
    wav, mp3ish = tmp_path / "a.wav", tmp_path / "b.flac"
    for path in (wav, mp3ish):
        subprocess.run(
            ["sox", "-n", "-r", "16000", "-c", "1", str(path), "synth", "0.75", "sine", "300"],
            check=True,
        )
    assert clip_duration_ms(wav) == 750
    assert clip_duration_ms(mp3ish) == 750  # not a WAV: measured by `sox --i -D`
    (tmp_path / "junk.mp3").write_bytes(b"not audio")
    assert clip_duration_ms(tmp_path / "junk.mp3") is None
