"""The snlp/v1 board channel: reliable commands, typed events, presence (SPEC §3).

Sans-I/O cores (``outbox``, ``presence``) take ``now`` and return effects; ``channel`` is the
asyncio shell (a service ``Component``); ``wire`` maps the ``topics`` models to the frozen
dataclasses in ``model``; ``outputs`` publishes, alarms and counts.
"""

from gateway.board.channel import BoardChannel, BoardEventSink
from gateway.board.device import Download
from gateway.board.model import (
    AppTaskEvent,
    AudioEvent,
    AudioEventKind,
    BoardEvent,
    ButtonEvent,
    ButtonPress,
    Outcome,
    OutcomeKind,
    PresenceChange,
    Report,
)

__all__ = [
    "AppTaskEvent",
    "AudioEvent",
    "AudioEventKind",
    "BoardChannel",
    "BoardEvent",
    "BoardEventSink",
    "ButtonEvent",
    "ButtonPress",
    "Download",
    "Outcome",
    "OutcomeKind",
    "PresenceChange",
    "Report",
]
