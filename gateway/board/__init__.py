"""The snlp/v1 board channel: reliable commands, typed events, presence (SPEC §3).

Sans-I/O cores (``outbox``, ``presence``) take ``now`` and return effects; ``channel`` is the
asyncio shell (a service ``Component``); ``wire`` maps the ``topics`` models to the frozen
dataclasses in ``model``; ``outputs`` publishes, alarms and counts.
"""

from gateway.board.channel import BoardChannel, BoardEventSink
from gateway.board.device import DownloadInFlight
from gateway.board.model import (
    AudioEventKind,
    BoardAppTask,
    BoardAudio,
    BoardButton,
    BoardCueDone,
    BoardEvent,
    BoardReport,
    Outcome,
    OutcomeKind,
    PresenceChange,
    PressKind,
)

__all__ = [
    "AudioEventKind",
    "BoardAppTask",
    "BoardAudio",
    "BoardButton",
    "BoardChannel",
    "BoardCueDone",
    "BoardEvent",
    "BoardEventSink",
    "BoardReport",
    "DownloadInFlight",
    "Outcome",
    "OutcomeKind",
    "PresenceChange",
    "PressKind",
]
