"""docs/scale-out.md's owner one-liner computes the owner the code computes (NUL separator,
8-byte BLAKE2b digest, big-endian, ties to the greater id): an operator predicting owners with
it gets the gateway's answers."""

from __future__ import annotations

import contextlib
import io
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cluster import owner_of
from gateway.cluster.membership import weight

DOC = Path(__file__).parents[3] / "docs" / "scale-out.md"
MARK = "<!-- owner-one-liner -->"


def _one_liner() -> list[str]:
    """The documented command line: ``python3 -c CODE DEV GW...``."""
    after = DOC.read_text(encoding="utf-8").split(MARK, 1)[1]
    line = next(x.strip() for x in after.splitlines() if x.strip().startswith("python3 -c"))
    return shlex.split(line)


def test_the_documented_example_runs_as_printed() -> None:
    argv = _one_liner()
    assert argv[:2] == ["python3", "-c"]
    dev, gateways = argv[3], argv[4:]
    assert (dev, gateways) == ("aa_bb_cc_00_00_01", ["gw1", "gw2", "gw3"])
    done = subprocess.run(
        [sys.executable, *argv[1:]], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout == owner_of(dev, gateways) + "\n"


def test_the_documented_formula_is_the_codes_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    code = _one_liner()[2]
    gateways = ["gw1", "gw2", "gw3", "gateway-east-7", "网关"]
    for dev in [f"aa_bb_cc_00_00_{n:02x}" for n in range(200)]:
        for members in (gateways, gateways[:2], gateways[2:]):
            monkeypatch.setattr(sys, "argv", ["-c", dev, *members])
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(code, {})  # noqa: S102 - the documented line, as `python3 -c` runs it
            assert out.getvalue() == owner_of(dev, members) + "\n", (dev, members)


def test_the_weight_is_the_nul_separated_8_byte_digest() -> None:
    import hashlib  # noqa: PLC0415 - the doc's formula, spelled out

    digest = hashlib.blake2b(b"gw1\x00aa_bb_cc_00_00_01", digest_size=8).digest()
    assert weight("gw1", "aa_bb_cc_00_00_01") == int.from_bytes(digest, "big")
    assert weight("gw1", "aa_bb_cc_00_00_01") != int.from_bytes(
        hashlib.blake2b(b"gw1aa_bb_cc_00_00_01").digest(), "big"
    )
