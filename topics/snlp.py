"""snlp/v1 board channel: ack, report, heartbeat and presence envelopes, and the parse/encode API.

Commands live in `topics.snlp_commands`, events in `topics.snlp_events`. Board messages ignore
unknown keys; `v`, when present, must be 1. The evt topic also accepts legacy text events.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, TypeAdapter, model_validator

from topics.snlp_commands import COMMAND_ADAPTER, AnyCommand, Command
from topics.snlp_events import EVENT_ADAPTER, AnyEvent, is_legacy_text, parse_legacy_event
from topics.tree import TopicKind
from topics.wire import DEFAULT_MAX_BYTES, DeviceModel, check_version, encode, load_object, validate

__all__ = [
    "BOARD_KINDS",
    "Ack",
    "BoardMessage",
    "BoardStatus",
    "Heartbeat",
    "Playing",
    "Report",
    "encode_board_message",
    "encode_command",
    "parse_board_message",
    "parse_command",
]

NonNeg = Annotated[int, Field(ge=0)]


class _BoardEnvelope(DeviceModel):
    v: Literal[1] = 1
    id: str | None = None
    ts: int | None = None


class Ack(_BoardEnvelope):
    """Receipt of a command (`snlp/v1/{dev}/ack`)."""

    ref: Annotated[str, Field(min_length=1)]
    cmd: str | None = None
    status: Literal["accepted", "rejected", "duplicate", "busy"]
    code: int | str | None = None
    current_ref: str | None = None
    current_prio: int | None = None


class Report(_BoardEnvelope):
    """Progress or final result of a long command such as DOWNLOAD (`…/rpt`)."""

    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"stage": {"const": "done"}}},
            "then": {"required": ["ok"], "properties": {"ok": {"type": "boolean"}}},
        }
    )

    ref: Annotated[str, Field(min_length=1)]
    cmd: str | None = None
    stage: Literal["progress", "done"]
    ok: bool | None = None
    bytes: NonNeg | None = None
    total: NonNeg | None = None
    sha256: str | None = None
    code: int | str | None = None

    @model_validator(mode="after")
    def _done_has_ok(self) -> Report:
        if self.stage == "done" and self.ok is None:
            raise ValueError("a final report (stage done) needs ok")
        return self


class Playing(DeviceModel):
    ref: str | None = None
    name: str | None = None
    prio: int | None = None


class Heartbeat(_BoardEnvelope):
    """Every 30 s (`…/hb`); every figure optional."""

    up_ms: NonNeg | None = None
    rssi: int | None = None
    heap: NonNeg | None = None
    sd_free_mb: float | None = None
    playing: bool | Playing | None = None
    fw: str | None = None


class BoardStatus(_BoardEnvelope):
    """Retained presence (`…/status`), from the board's LWT or written by the gateway."""

    online: bool
    session: str | None = None
    by: Literal["board", "gateway"] | None = None


BoardMessage = Ack | Report | AnyEvent | Heartbeat | BoardStatus | AnyCommand
_ADAPTERS: dict[TopicKind, TypeAdapter[BoardMessage]] = {
    TopicKind.ACK: TypeAdapter(Ack),
    TopicKind.RPT: TypeAdapter(Report),
    TopicKind.HB: TypeAdapter(Heartbeat),
    TopicKind.STATUS: TypeAdapter(BoardStatus),
    TopicKind.EVT: EVENT_ADAPTER,  # type: ignore[dict-item]  # Annotated union adapter
    TopicKind.CMD: COMMAND_ADAPTER,  # type: ignore[dict-item]
}

BOARD_KINDS = frozenset(_ADAPTERS)


def parse_board_message(
    kind: TopicKind, payload: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> BoardMessage:
    """Parse a payload received on `snlp/v1/{dev}/<kind>` into its typed model.

    Raises `PayloadError` for every bad payload; `ValueError` if `kind` is not a board topic.
    """
    adapter = _ADAPTERS.get(kind)
    if adapter is None:
        raise ValueError(f"{kind} is not an snlp/v1 board topic")
    if kind is TopicKind.EVT and len(payload) <= max_bytes and is_legacy_text(payload):
        return parse_legacy_event(payload)
    obj = load_object(payload, max_bytes=max_bytes)
    check_version(obj)
    return validate(adapter, obj)


def parse_command(payload: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> AnyCommand:
    obj = load_object(payload, max_bytes=max_bytes)
    check_version(obj, required=True)
    return validate(COMMAND_ADAPTER, obj)


def encode_command(cmd: Command) -> bytes:
    """Compact JSON for `snlp/v1/{dev}/cmd`."""
    return encode(cmd)


def encode_board_message(message: BoardMessage) -> bytes:
    """Compact JSON of a board message (board simulators, tests)."""
    return encode(message)
