"""Loading and checking the catalog (start-up I/O, not the hot path).

``load_catalog(path)`` reads one JSON file or every ``*.json`` directly in a directory and
returns the catalog plus warnings, or raises :class:`CatalogError` listing every problem with
its file and JSON path. ``catalog_check_main(path)`` backs ``snlpgw catalog check PATH``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from gateway.tasks.core.catalog import Catalog, TaskDef
from gateway.tasks.core.expected import ReadText, resolve_with_source
from gateway.tasks.core.rules import LISTEN_RATIO_MAX, LISTEN_RATIO_MIN
from gateway.tasks.core.steps import GenerateStepDef, StepDef


@dataclass(frozen=True, slots=True)
class CatalogIssue:
    file: str
    path: str  # JSONPath inside the file, e.g. ``$[0].lessons[1].clips``; ``$`` is the document
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.path}: {self.message}"


class CatalogError(Exception):
    """The catalog did not load; ``issues`` names every problem found."""

    def __init__(self, issues: list[CatalogIssue]) -> None:
        self.issues = tuple(issues)
        super().__init__("; ".join(str(i) for i in issues))


@dataclass(frozen=True, slots=True)
class LoadResult:
    catalog: Catalog
    warnings: tuple[CatalogIssue, ...] = ()
    files: tuple[str, ...] = field(default=())


def _loc(prefix: str, loc: tuple[int | str, ...]) -> str:
    out = "$" + prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _parse_file(file: Path, errors: list[CatalogIssue], warns: list[CatalogIssue]) -> list[TaskDef]:
    name = str(file)
    try:
        raw: Any = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        errors.append(CatalogIssue(name, "$", f"cannot read JSON: {exc}"))
        return []
    items, many = (raw, True) if isinstance(raw, list) else ([raw], False)
    tasks: list[TaskDef] = []
    for n, item in enumerate(items):
        prefix = f"[{n}]" if many else ""
        try:
            task = TaskDef.model_validate(item)
        except ValidationError as exc:
            errors.extend(
                CatalogIssue(name, _loc(prefix, tuple(e["loc"])), e["msg"]) for e in exc.errors()
            )
            continue
        for j, lesson in enumerate(item["lessons"]):
            if list(lesson.get("clips", [])) != list(task.lessons[j].clips):
                warns.append(
                    CatalogIssue(name, _loc(prefix, ("lessons", j, "clips")), "clips sorted")
                )
            sentences = task.lessons[j].sentences
            if sentences and len(sentences) != len(task.lessons[j].clips):
                msg = f"{len(sentences)} sentences for {len(task.lessons[j].clips)} clips"
                warns.append(CatalogIssue(name, _loc(prefix, ("lessons", j, "sentences")), msg))
        if not LISTEN_RATIO_MIN <= task.listen_ratio <= LISTEN_RATIO_MAX:
            clamped = task.effective_ratio
            msg = f"{task.listen_ratio} outside [{LISTEN_RATIO_MIN}, {LISTEN_RATIO_MAX}], clamped to {clamped}"
            warns.append(CatalogIssue(name, _loc(prefix, ("listen_ratio",)), msg))
            task = task.model_copy(update={"listen_ratio": clamped})
        tasks.append(task)
    return tasks


def load_catalog(path: Path | str) -> LoadResult:
    """Load a JSON file or every ``*.json`` in a directory; duplicate (app_id, task_id) is an error."""
    root = Path(path)
    if root.is_dir():
        files = sorted(root.glob("*.json"))
    elif root.is_file():
        files = [root]
    else:
        raise CatalogError([CatalogIssue(str(root), "$", "no such file or directory")])
    errors: list[CatalogIssue] = []
    warns: list[CatalogIssue] = []
    if not files:
        errors.append(CatalogIssue(str(root), "$", "no *.json task files"))
    tasks: dict[tuple[str, str], TaskDef] = {}
    origin: dict[tuple[str, str], str] = {}
    for file in files:
        for task in _parse_file(file, errors, warns):
            if task.key in tasks:
                where = f"duplicate task {task.app_id}/{task.task_id} (first in {origin[task.key]})"
                errors.append(CatalogIssue(str(file), "$", where))
                continue
            tasks[task.key] = task
            origin[task.key] = str(file)
    if errors:
        raise CatalogError(errors)
    return LoadResult(Catalog(tasks), tuple(warns), tuple(str(f) for f in files))


def resource_reader(resource_dir: Path | str) -> ReadText:
    """A cached UTF-8 reader confined to ``resource_dir`` (None when missing/unreadable/outside)."""
    base = Path(resource_dir).resolve()

    @lru_cache(maxsize=4096)
    def read(relative: str) -> str | None:
        target = (base / relative).resolve()
        if not target.is_relative_to(base):
            return None
        try:
            return target.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    return read


def _step_name(step: StepDef) -> str:
    if isinstance(step, GenerateStepDef):
        return f"generate({step.rounds} rounds)"
    return step.type


def check_catalog(path: Path | str, resource_dir: Path | str | None = None) -> list[str]:
    """A readable report: errors, or tasks with lessons and each clip's expected-text source."""
    try:
        result = load_catalog(path)
    except CatalogError as exc:
        return [f"ERROR {issue}" for issue in exc.issues]
    read: ReadText | None = resource_reader(resource_dir) if resource_dir is not None else None
    lines = [f"WARNING {w}" for w in result.warnings]
    for task in result.catalog:
        lines.append(
            f"task {task.app_id}/{task.task_id} mode={task.interaction_mode} "
            f"listen_ratio={task.listen_ratio} min_window_ms={'default' if task.min_window_ms is None else task.min_window_ms}"
        )
        if task.interaction_mode == "STEPS":
            names = ", ".join(_step_name(step) for step in task.steps)
            lines.append(f"  assessment={task.assessment.timing} steps: {names}")
        for lesson in task.lessons:
            lines.append(f"  lesson {lesson.lesson_id}: {len(lesson.clips)} clips")
            for i, clip in enumerate(lesson.clips):
                text, source = resolve_with_source(task, lesson, i, read)
                lines.append(f"    {task.board_path(lesson, clip)}  expected[{source}]={text!r}")
    lines.append(f"OK {len(result.catalog)} tasks from {len(result.files)} files")
    return lines


def catalog_check_main(
    path: Path | str,
    resource_dir: Path | str | None = None,
    out: TextIO | None = None,
) -> int:
    """Print the report of :func:`check_catalog`; exit code 0 when it loads, 1 otherwise."""
    lines = check_catalog(path, resource_dir)
    stream = out if out is not None else sys.stdout
    stream.write("\n".join(lines) + "\n")
    return 1 if any(line.startswith("ERROR") for line in lines) else 0
