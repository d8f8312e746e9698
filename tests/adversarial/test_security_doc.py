"""docs/security.md is generated from the adversarial tests; it must not drift."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.adversarial import security_doc


def test_security_doc_is_current() -> None:
    assert security_doc.DOC.read_text(encoding="utf-8") == security_doc.render(), (
        "docs/security.md is stale: run .venv/bin/python -m tests.adversarial.security_doc --write"
    )


def test_every_adversarial_test_names_its_attack_and_defence() -> None:
    rows = security_doc.collect()  # raises DocstringError naming every offender
    assert all(r.attack and r.defence for r in rows)


def test_a_test_without_the_docstring_shape_is_refused(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(
        'async def test_ok():\n    """Attack: a.\n    Defence: b."""\n\n'
        'def test_bad():\n    """Checks something."""\n\n'
        "class TestGroup:\n    def test_undocumented(self):\n        pass\n",
        encoding="utf-8",
    )
    with pytest.raises(security_doc.DocstringError) as caught:
        security_doc.collect(tmp_path)
    assert caught.value.offenders == [
        "test_x.py::test_bad",
        "test_x.py::TestGroup::test_undocumented",
    ]


def test_rows_render_as_one_table_with_test_references(tmp_path: Path) -> None:
    (tmp_path / "test_y.py").write_text(
        'def test_pipe():\n    """Attack: sends a | b.\n    Defence: it is\n    dropped."""\n',
        encoding="utf-8",
    )
    rows = security_doc.collect(tmp_path)
    text = security_doc.render(rows)
    assert "| sends a \\| b. | it is dropped. | `tests/adversarial/test_y.py::test_pipe` |" in text
