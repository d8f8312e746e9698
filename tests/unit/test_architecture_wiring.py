"""One-phase wiring stays one-phase: every component is built once with its collaborators
(gateway/app.py, docs/architecture.md), so no ``attach``/``bind`` method, no "not attached"
guard and no link assigned after construction may come back under gateway/."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

GATEWAY = Path(__file__).parents[2] / "gateway"
TWO_PHASE_METHODS = {"attach", "bind"}
GUARD_WORDS = ("not attached", "before attach", "before bind")


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(GATEWAY.rglob("*.py")):
        yield path.relative_to(GATEWAY).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


def _two_phase(tree: ast.Module) -> Iterator[str]:
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for item in cls.body:
            is_def = isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            if is_def and item.name in TWO_PHASE_METHODS:
                yield f"def {item.name}"
    for node in ast.walk(tree):
        text = node.value if isinstance(node, ast.Constant) else None
        if isinstance(text, str) and any(word in text.lower() for word in GUARD_WORDS):
            yield repr(text)


def test_no_attach_or_bind_method_and_no_not_attached_guard() -> None:
    found = {(name, what) for name, tree in _modules() for what in _two_phase(tree)}
    assert found == set(), "two-phase wiring is back; build the component in one go"


def test_the_composition_root_links_nothing_by_assignment() -> None:
    """``x.y = z`` in gateway/app.py would be a link made after construction."""
    tree = ast.parse((GATEWAY / "app.py").read_text(encoding="utf-8"))
    assigned = [
        ast.unparse(target)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute)
    ]
    assert assigned == []


def test_the_check_sees_what_it_forbids() -> None:
    """The scan itself: a two-phase component and a guard are both caught."""
    source = (
        "class C:\n"
        "    def attach(self, ctx): ...\n"
        "    async def bind(self): ...\n"
        "    def run(self):\n"
        "        raise RuntimeError('component Not Attached')\n"
    )
    assert sorted(_two_phase(ast.parse(source))) == [
        "'component Not Attached'",
        "def attach",
        "def bind",
    ]
