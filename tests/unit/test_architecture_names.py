"""Every type has one name and one home: no class name is defined twice in the shipped code.

A reader (or a grep) finding ``class X`` must find the one ``X``. The wire models in ``topics/``
are the contract and keep their names; inside types take a domain name (``BoardAudio`` on the
board side, ``AudioPhase`` in the task core, ``Voice…`` for the voice session's events).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "codec", "topics")


def class_homes(root: Path = ROOT) -> dict[str, list[str]]:
    """Class name → every ``path:line`` defining it (nested and private classes included)."""
    homes: dict[str, list[str]] = defaultdict(list)
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    homes[node.name].append(f"{path.relative_to(root)}:{node.lineno}")
    return homes


def duplicates(homes: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: where for name, where in homes.items() if len(where) > 1}


def test_every_class_name_is_defined_once() -> None:
    found = duplicates(class_homes())
    listing = "\n".join(f"  {name}: {', '.join(where)}" for name, where in sorted(found.items()))
    assert not found, f"class names defined more than once:\n{listing}"


def test_the_walk_sees_a_duplicate(tmp_path: Path) -> None:
    for package, body in (
        ("gateway", "class A:\n    class Inner: ...\n"),
        ("topics", "class A: ...\n"),
    ):
        (tmp_path / package).mkdir()
        (tmp_path / package / "m.py").write_text(body)
    (tmp_path / "codec").mkdir()
    (tmp_path / "codec" / "n.py").write_text("def f():\n    class Inner: ...\n")
    found = duplicates(class_homes(tmp_path))
    assert found == {
        "A": ["gateway/m.py:1", "topics/m.py:1"],
        "Inner": ["gateway/m.py:2", "codec/n.py:2"],
    }
