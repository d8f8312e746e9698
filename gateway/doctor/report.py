"""Doctor rows and the table they print as."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass


class Status(enum.Enum):
    OK = "ok"
    FAIL = "FAIL"
    SKIP = "skip"  # not applicable, or a check it depends on failed (named in the detail)


@dataclass(frozen=True, slots=True)
class Row:
    check: str
    status: Status
    detail: str


def ok(check: str, detail: str) -> Row:
    return Row(check, Status.OK, detail)


def fail(check: str, detail: str) -> Row:
    return Row(check, Status.FAIL, detail)


def skip(check: str, detail: str) -> Row:
    return Row(check, Status.SKIP, detail)


def render(rows: Sequence[Row]) -> str:
    width = max(len(r.check) for r in rows)
    lines = [f"{'check':<{width}}  status  detail"]
    lines += [f"{r.check:<{width}}  {r.status.value:<6}  {r.detail}" for r in rows]
    failed = sum(r.status is Status.FAIL for r in rows)
    lines.append(f"{failed} check(s) failed" if failed else "all checks passed")
    return "\n".join(lines) + "\n"


def exit_code(rows: Sequence[Row]) -> int:
    return 1 if any(r.status is Status.FAIL for r in rows) else 0
