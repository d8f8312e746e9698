"""How the demo reads on a terminal: one timeline line per event, then the stored instance."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Write = Callable[[str], None]


def _short(value: object, width: int) -> str:
    text = "-" if value is None or value == "" else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def metrics_text(metrics: object) -> str:
    if not isinstance(metrics, list) or not metrics:
        return "[] (not assessed)"
    return ", ".join(
        f"{m.get('method')}={float(m.get('value', 0.0)):.2f}"
        for m in metrics
        if isinstance(m, dict)
    )


class DemoTimeline:
    """Prints ``+ms  what`` lines, relative to the moment the lesson was requested."""

    def __init__(self, write: Write) -> None:
        self._write = write
        self._t0 = time.monotonic()
        self._wall_t0_ms = time.time() * 1000
        self.lines: list[str] = []

    def rel_ms(self) -> int:
        return round((time.monotonic() - self._t0) * 1000)

    def _rel_wall(self, epoch_ms: object) -> str:
        if not isinstance(epoch_ms, int):
            return "?"
        return f"{round(epoch_ms - self._wall_t0_ms)}"

    def note(self, text: str) -> None:
        line = f"{self.rel_ms():>7} ms  {text}"
        self.lines.append(line)
        self._write(line)

    def task_event(self, event: Mapping[str, Any], said: Mapping[int, str | None]) -> None:
        name = str(event.get("event"))
        step = event.get("step_index")
        data = event.get("data") or {}
        label = f"step {int(step) + 1}" if isinstance(step, int) else "lesson"
        match name:
            case "instance.started":
                self.note(f"lesson started (instance {event.get('instance_id')})")
            case "step.played":
                self.note(f"{label}: PLAY_MEDIA {data.get('name')}")
            case "window.opened":
                reading = said.get(step) if isinstance(step, int) else None
                what = f'child says "{reading}"' if reading else "child stays silent"
                self.note(f"{label}: listen window opened ({data.get('window_ms')} ms) — {what}")
            case "window.closed":
                self.note(
                    f"{label}: listen window closed — planned {self._rel_wall(data.get('planned_close_ms'))}"
                    f" ms, actual {self._rel_wall(data.get('actual_close_ms'))} ms, "
                    f"lateness {data.get('lateness_ms')} ms"
                )
            case "speech.started":
                self.note(f"{label}: VAD speech started")
            case "speech.stopped":
                self.note(f"{label}: VAD speech stopped ({data.get('duration_ms')} ms of speech)")
            case "presence.changed":
                self.note(f"board {'online' if data.get('online') else 'offline'}")
            case "instance.completed":
                self.note("lesson completed")
            case _:
                self.note(f"{label}: {name} {dict(data) if data else ''}".rstrip())

    def assessment(self, msg: Mapping[str, Any]) -> None:
        step = msg.get("step_index")
        label = f"step {int(step) + 1}" if isinstance(step, int) else "step ?"
        self.note(
            f'{label}: assessment — heard "{msg.get("asr_text")}", expected '
            f'"{msg.get("expected_text")}": {metrics_text(msg.get("metrics"))}'
        )


def instance_table(body: Mapping[str, Any]) -> list[str]:
    """The ``GET /task/instance/{id}`` answer as a compact table."""
    inst = body.get("instance") or {}
    steps: Sequence[Mapping[str, Any]] = body.get("steps") or []
    lines = [
        f"instance {inst.get('instance_id')}: {inst.get('app_id')}/{inst.get('task_id')}/"
        f"{inst.get('lesson_id')} state={inst.get('state')} steps={len(steps)}",
        f"{'#':>2}  {'clip':<7} {'dur ms':>6} {'win ms':>6} {'late':>5}  "
        f"{'expected':<26} {'heard':<26} metrics",
    ]
    for s in steps:
        planned, closed = s.get("window_planned_close_ms"), s.get("window_closed_ms")
        late = closed - planned if isinstance(planned, int) and isinstance(closed, int) else None
        lines.append(
            f"{int(s.get('step_index', 0)) + 1:>2}  {_short(s.get('clip'), 7):<7} "
            f"{_short(s.get('duration_ms'), 6):>6} {_short(s.get('window_ms'), 6):>6} "
            f"{_short(late, 5):>5}  {_short(s.get('expected_text'), 26):<26} "
            f"{_short(s.get('asr_text'), 26):<26} {metrics_text(s.get('metrics'))}"
        )
    return lines
