"""Every type has one name and one home: no type name is defined twice in the tree (the shipped
packages and the dev stack, benchmarks and tests around them).

Types are classes (nested and private ones included) and module-level type aliases (a
CamelCase name bound at module level, e.g. ``Effect = Send | Done``).

A reader (or a grep) finding ``class X`` must find the one ``X``; a test double takes the name of
what it stands for (``BoardSink``, ``ReporterRig``), never a bare ``Rig`` or ``Sink``. The wire
models in ``topics/`` are the contract and keep their names; inside types take a domain name
(``BoardAudio`` on the board side, ``AudioPhase`` in the task core, ``Voice…`` for the voice
session's events).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "codec", "topics", "devstack", "bench", "tests")


def _is_type_alias_name(name: str) -> bool:
    bare = name.lstrip("_")
    return bare[:1].isupper() and not bare.isupper()  # CamelCase, not a CONSTANT


def _module_aliases(tree: ast.Module) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        found += [(t.id, node.lineno) for t in targets if isinstance(t, ast.Name)]
    return [(name, line) for name, line in found if _is_type_alias_name(name)]


def type_homes(root: Path = ROOT) -> dict[str, list[str]]:
    """Type name → every ``path:line`` defining it."""
    homes: dict[str, list[str]] = defaultdict(list)
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            where = path.relative_to(root)
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    homes[node.name].append(f"{where}:{node.lineno}")
            for name, line in _module_aliases(tree):
                homes[name].append(f"{where}:{line}")
    return homes


def duplicates(homes: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: where for name, where in homes.items() if len(where) > 1}


def test_every_type_name_is_defined_once() -> None:
    found = duplicates(type_homes())
    listing = "\n".join(f"  {name}: {', '.join(where)}" for name, where in sorted(found.items()))
    assert not found, f"type names defined more than once:\n{listing}"


def test_the_walk_sees_a_duplicate(tmp_path: Path) -> None:
    for package, body in (
        ("gateway", "class A:\n    class Inner: ...\n"),
        ("topics", "class A: ...\n"),
    ):
        (tmp_path / package).mkdir()
        (tmp_path / package / "m.py").write_text(body)
    (tmp_path / "codec").mkdir()
    (tmp_path / "codec" / "n.py").write_text(
        "def f():\n    class Inner: ...\n"
        "Inner = int | str\nEffect: TypeAlias = int\nLIMIT = 3\n_Row = tuple[int, int]\n"
    )
    (tmp_path / "topics" / "o.py").write_text("Effect = int\nLIMIT = 4\n_Row = int\nlog = 1\n")
    found = duplicates(type_homes(tmp_path))
    assert found == {
        "A": ["gateway/m.py:1", "topics/m.py:1"],
        "Inner": ["gateway/m.py:2", "codec/n.py:2", "codec/n.py:3"],
        "Effect": ["codec/n.py:4", "topics/o.py:1"],
        "_Row": ["codec/n.py:6", "topics/o.py:3"],
    }
