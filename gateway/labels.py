"""Metric label values that come from device input: a fixed set per label, plus ``other``.

A Prometheus label value makes a new time series, and every series is a line of the retained
ops snapshot. A board that chose its own label values (a report's ``cmd``, an event name, a
command id echoed in an ``ack``) could grow the registry without bound and push the snapshot
past the broker's ``max_packet_size``. So every label fed by a device string goes through
:func:`bounded` with the finite set the contract allows; anything else counts as ``other``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import get_args

from gateway.tasks.core.events import AudioPhase, DeliveryResult, RuntimeEvent
from topics.snlp_commands import COMMAND_ADAPTER
from topics.snlp_events import AUDIO_EVENTS, CUE_EVENTS

OTHER = "other"
NONE = "none"


def _command_names() -> frozenset[str]:
    schema = COMMAND_ADAPTER.json_schema()
    names: set[str] = set()
    for model in schema.get("$defs", {}).values():
        cmd = model.get("properties", {}).get("cmd", {})
        names.update(cmd.get("enum", ()))
        if "const" in cmd:
            names.add(cmd["const"])
    return frozenset(names)


COMMANDS: frozenset[str] = _command_names()
REPORT_STAGES: frozenset[str] = frozenset({"progress", "done"})
BOARD_EVENTS: frozenset[str] = AUDIO_EVENTS | CUE_EVENTS | {"button", "app_task"}
# What the runtime reports as an ignored event: an event type, or an audio event kind.
RUNTIME_EVENTS: frozenset[str] = frozenset(
    {cls.__name__ for cls in get_args(RuntimeEvent)} | {str(kind) for kind in AudioPhase}
)
# Reasons a step fails or an instance is cancelled (gateway/tasks/core); anything new is `other`
# until it is listed here.
STEP_FAILURES: frozenset[str] = frozenset(
    {"watchdog", *(str(kind) for kind in AudioPhase), *(f"play_{o}" for o in DeliveryResult)}
)
CANCEL_REASONS: frozenset[str] = frozenset(
    {"button", "exit_phrase", "stopped", "restarted", "preempted", "offline", "gateway_restart"}
)


# Message types a xiaozhi server sends down (the chat upstream; semi-trusted, still bounded).
XIAOZHI_SERVER_TYPES: frozenset[str] = frozenset(
    {"hello", "stt", "tts", "llm", "mcp", "iot", "goodbye", "alert", "system", "listen"}
)


def bounded(value: object, allowed: Collection[str]) -> str:
    """``value`` as a label if it is one of ``allowed``; ``none`` for None; else ``other``."""
    if value is None:
        return NONE
    text = str(value)
    return text if text in allowed else OTHER


def board_event(evt: object) -> str:
    """A board event name as a label: the known names, ``app_task`` for any ``app_task.*``."""
    text = str(evt)
    if text.startswith("app_task."):
        return "app_task"
    return bounded(text, BOARD_EVENTS)
