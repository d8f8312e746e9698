"""Render the settings tree as the markdown table of ``docs/settings.md``
(``python -m gateway.settings_doc --write`` rewrites it there; without ``--write`` it prints it).

A test compares that page's table with this output, so the documentation cannot drift.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from gateway.settings import Settings

DOC = Path("docs") / "settings.md"  # relative to the repository root
BEGIN = "<!-- settings-table:begin -->"
END = "<!-- settings-table:end -->"


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        return "(host name)"
    value = info.default
    if isinstance(value, tuple):
        value = ", ".join(str(v) for v in value)
    return f"`{value}`" if value is not None else "unset"


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows: list[str] = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            rows.extend(_rows(annotation, f"{prefix}{name.upper()}__"))
            continue
        doc = (info.description or "").replace("|", "\\|")
        rows.append(f"| `{prefix}{name.upper()}` | {_default(info)} | {doc} |")
    return rows


def render() -> str:
    header = ["| environment variable | default | meaning |", "|---|---|---|"]
    return "\n".join([BEGIN, *header, *_rows(Settings, "SNLPGW_"), END])


def update_doc(path: Path) -> bool:
    """Rewrite the table between the markers; returns True when the file changed."""
    text = path.read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    updated = text[:start] + render() + text[end:]
    if updated != text:
        path.write_text(updated, encoding="utf-8")
    return updated != text


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        update_doc(DOC)
    else:
        sys.stdout.write(render() + "\n")
