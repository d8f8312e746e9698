"""The board channel's inside types: frozen dataclasses, no wire format, no I/O.

Pydantic (``topics``) parses at the edge; what travels to the cores and to the runtime is
these small values. Times are either ``mono`` (``time.monotonic()`` seconds, for deadlines)
or ``ms`` (epoch milliseconds, as on the wire).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, slots=True)
class Envelope:
    """A command ready for the wire; resends reuse ``payload`` byte for byte (same id)."""

    id: str
    name: str  # the command name, e.g. "PLAY_MEDIA"
    payload: bytes  # encoded command envelope (its ts is the submit time)
    ttl_ms: int


class AckStatus(StrEnum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    DUPLICATE = "duplicate"
    BUSY = "busy"


class OutcomeKind(StrEnum):
    """How a command ended for its caller."""

    ACCEPTED = "accepted"  # acked accepted
    DUPLICATE = "duplicate"  # acked duplicate: the board had it already (delivered)
    REJECTED = "rejected"
    BUSY = "busy"
    EXPIRED = "expired"  # ttl_ms passed before any ack
    FAILED = "failed"  # resends exhausted while online, no ack
    OVERFLOW = "overflow"  # refused: the device's outbox was full
    CANCELLED = "cancelled"  # the channel shut down


DELIVERED = frozenset({OutcomeKind.ACCEPTED, OutcomeKind.DUPLICATE})


@dataclass(frozen=True, slots=True)
class Outcome:
    id: str
    command: str
    kind: OutcomeKind
    sends: int  # how many times it went on the wire (1 = no resend)
    code: str | None = None  # the board's ack code, if any
    ack_latency_s: float | None = None  # first send → ack, when acked

    @property
    def delivered(self) -> bool:
        return self.kind in DELIVERED


@dataclass(frozen=True, slots=True)
class BoardAck:
    ref: str
    status: AckStatus
    cmd: str | None = None
    code: str | None = None


@dataclass(frozen=True, slots=True)
class BoardReport:
    """A DOWNLOAD (or other long command) progress or final report."""

    ref: str
    cmd: str | None
    stage: str  # "progress" | "done" (others passed through)
    ok: bool | None = None
    code: str | None = None
    bytes: int | None = None
    total: int | None = None
    sha256: str | None = None

    @property
    def final(self) -> bool:
        return self.stage == "done"


class AudioEventKind(StrEnum):
    STARTED = "audio.started"
    COMPLETED = "audio.completed"
    STOPPED = "audio.stopped"
    PAUSED = "audio.paused"
    RESUMED = "audio.resumed"
    FAILED = "audio.failed"


@dataclass(frozen=True, slots=True)
class BoardAudio:
    kind: AudioEventKind
    name: str | None = None
    duration_ms: int | None = None
    reason: str | None = None  # eof | stopped | preempted | error
    by: str | None = None  # id of the command that preempted this playback
    code: str | None = None  # failure code (audio.failed)


class PressKind(StrEnum):
    SHORT = "short"
    LONG = "long"
    DOUBLE = "double"


@dataclass(frozen=True, slots=True)
class BoardButton:
    press: PressKind
    key: str | None = None


@dataclass(frozen=True, slots=True)
class BoardAppTask:
    evt: str  # "app_task.<something>"
    state: str
    detail: Mapping[str, object]  # read-only view


@dataclass(frozen=True, slots=True)
class BoardCueDone:
    """``sound.completed`` / ``wait.elapsed`` / ``wait.cancelled``: counted; the runtime steps
    on its own clock, so nothing waits for them."""

    evt: str
    type: str | None = None
    ms: int | None = None


EventBody = BoardAudio | BoardButton | BoardCueDone | BoardAppTask


@dataclass(frozen=True, slots=True)
class BoardEvent:
    """One event from a board, structured or translated from the legacy text form."""

    dev: str
    body: EventBody
    ref: str | None  # the command id it belongs to, or None
    id: str | None
    board_ts_ms: int | None  # the board's clock (may be time-zone shifted)
    received_ms: int  # the gateway's clock
    received_mono: float
    legacy: bool = False


@dataclass(frozen=True, slots=True)
class BoardHeartbeat:
    up_ms: int | None = None
    rssi: int | None = None
    heap: int | None = None
    sd_free_mb: float | None = None
    fw: str | None = None  # cut to FW_MAX characters when parsed


@dataclass(frozen=True, slots=True)
class OnlineStatus:
    online: bool
    by_gateway: bool
    session: str | None = None


@dataclass(frozen=True, slots=True)
class PresenceChange:
    dev: str
    online: bool
    reason: str  # heartbeat | status | activity | missed_heartbeats | lwt
    at_mono: float
