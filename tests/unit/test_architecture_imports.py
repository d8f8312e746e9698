"""No import circle under gateway/: the module-level import graph is acyclic.

Built with ``ast`` (nothing is imported): every module-level ``import`` / ``from ... import``
of a ``gateway`` module is an edge; imports inside functions and under ``if TYPE_CHECKING:``
are not (they do not run at import time). ``from gateway.pkg import name`` points at
``gateway/pkg/name.py`` when that module exists, else at the package itself.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "gateway"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level(body: list[ast.stmt], *, typing: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if typing or not _is_type_checking(node):
                yield from _module_level(node.body, typing=typing)
            yield from _module_level(node.orelse, typing=typing)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _module_level(block, typing=typing)
            for handler in node.handlers:
                yield from _module_level(handler.body, typing=typing)


def imports_of(name: str, path: Path, known: dict[str, Path], *, typing: bool = False) -> set[str]:
    """``typing``: count ``if TYPE_CHECKING:`` imports too."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in _module_level(tree.body, typing=typing):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        for imported in targets:
            target = imported
            while target and target not in known:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph(*, typing: bool = False) -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known, typing=typing) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def test_the_gateway_package_has_no_import_circle() -> None:
    found = cycles(import_graph())
    assert not found, "import circles under gateway/:\n" + "\n".join(
        " <-> ".join(component) for component in found
    )


def test_the_xiaozhi_room_has_no_circle_even_through_type_checking_imports() -> None:
    graph = import_graph(typing=True)
    room = {m: {t for t in ts if t.startswith("gateway.xiaozhi")} for m, ts in graph.items()}
    found = cycles({m: ts for m, ts in room.items() if m.startswith("gateway.xiaozhi")})
    assert not found, f"import circles in gateway/xiaozhi/: {found}"


def test_the_checker_finds_a_circle_and_ignores_type_checking_imports(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    source = (
        "from typing import TYPE_CHECKING\n"
        "from pkg import b\n"
        "if TYPE_CHECKING:\n    from pkg.c import C\n"
        "def f() -> None:\n    import pkg.c\n"
    )
    (pkg / "a.py").write_text(source)
    known = {"pkg": pkg, "pkg.a": pkg / "a.py", "pkg.b": pkg / "b.py", "pkg.c": pkg / "c.py"}
    assert imports_of("pkg.a", pkg / "a.py", known) == {"pkg.b"}
    assert imports_of("pkg.a", pkg / "a.py", known, typing=True) == {"pkg.b", "pkg.c"}


def test_the_xiaozhi_rooms_modules_stay_within_300_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in sorted((ROOT / PACKAGE / "xiaozhi").rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > 300
    }
    assert not long, f"split these along their seams: {long}"
