"""The board channel's edge: ``topics`` models in, frozen dataclasses out (and back).

Everything that knows the JSON shape of snlp/v1 is in ``topics``; this module only maps the
parsed models to the channel's inside types and builds what the channel publishes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gateway.board.model import (
    AckStatus,
    AudioEventKind,
    BoardAck,
    BoardAppTask,
    BoardAudio,
    BoardButton,
    BoardCueDone,
    BoardHeartbeat,
    BoardReport,
    Envelope,
    EventBody,
    OnlineStatus,
    PressKind,
)
from topics import snlp, snlp_events
from topics.backend import PresenceChanged, PresenceData
from topics.errors import PayloadError, PayloadReason
from topics.fastwire import ParamsCache, command_bytes
from topics.snlp_commands import COMMAND_ADAPTER, CommandParams, Priority, TaskVerb, command
from topics.tree import TopicKind
from topics.wire import encode, validate

__all__ = [
    "BoardInbound",
    "ParsedEvent",
    "build_command",
    "build_command_from_mapping",
    "parse",
    "presence_task_event",
    "status_payload",
]


FW_MAX = 64  # characters of a heartbeat's firmware version kept (a device's string, bounded)


@dataclass(frozen=True, slots=True)
class ParsedEvent:
    """An event body plus its envelope fields (the shell adds the device and receive times)."""

    body: EventBody
    id: str | None
    ref: str | None
    ts_ms: int | None
    legacy: bool


BoardInbound = BoardAck | BoardReport | ParsedEvent | BoardHeartbeat | OnlineStatus


def _code(value: int | str | None) -> str | None:
    return None if value is None else str(value)


def parse(kind: TopicKind, payload: bytes, *, max_bytes: int) -> BoardInbound:
    """Parse a payload from ``snlp/v1/{dev}/<kind>``; every bad one raises ``PayloadError``."""
    message = snlp.parse_board_message(kind, payload, max_bytes=max_bytes)
    match message:
        case snlp.Ack():
            return BoardAck(
                message.ref, AckStatus(message.status), message.cmd, _code(message.code)
            )
        case snlp.Report():
            return BoardReport(
                ref=message.ref,
                cmd=message.cmd,
                stage=message.stage,
                ok=message.ok,
                code=_code(message.code),
                bytes=message.bytes,
                total=message.total,
                sha256=message.sha256,
            )
        case snlp.Heartbeat():
            return BoardHeartbeat(
                up_ms=message.up_ms,
                rssi=message.rssi,
                heap=message.heap,
                sd_free_mb=message.sd_free_mb,
                fw=message.fw[:FW_MAX] if message.fw is not None else None,
            )
        case snlp.BoardStatus():
            return OnlineStatus(message.online, message.by == "gateway", message.session)
        case snlp_events.Event():
            body = _event_body(message)
            legacy = kind is TopicKind.EVT and snlp_events.is_legacy_text(payload)
            return ParsedEvent(body, message.id, message.ref, message.ts, legacy)
        case _:  # a command echoed on a board topic
            raise PayloadError(PayloadReason.UNKNOWN_TYPE, f"{type(message).__name__} on {kind}")


def _event_body(message: snlp_events.Event) -> EventBody:
    match message:
        case snlp_events.AudioEvent(data=data):
            return BoardAudio(
                AudioEventKind(message.evt),
                name=data.name,
                duration_ms=data.duration_ms,
                reason=data.reason,
                by=data.by,
                code=_code(data.code),
            )
        case snlp_events.ButtonEvent(data=data):
            return BoardButton(PressKind(data.press), data.key)
        case snlp_events.CueEvent(data=data):
            return BoardCueDone(message.evt, data.type, data.ms)
        case snlp_events.AppTaskEvent(data=data):
            return BoardAppTask(message.evt, data.state, MappingProxyType(dict(data.detail)))
        case _:
            raise PayloadError(PayloadReason.UNKNOWN_TYPE, f"event {message.evt!r}")


def build_command(
    params: CommandParams,
    *,
    id: str,
    ts_ms: int,
    prio: Priority,
    ttl_ms: int,
    task_verb: TaskVerb | None = None,
) -> Envelope:
    """Validate and encode a command once; resends publish the same bytes."""
    model = command(params, id=id, ts=ts_ms, prio=prio, ttl_ms=ttl_ms, task_verb=task_verb)
    return Envelope(id, model.cmd, snlp.encode_command(model), ttl_ms)


def build_command_from_mapping(
    cmd: str,
    params: Mapping[str, object],
    *,
    id: str,
    ts_ms: int,
    prio: int,
    ttl_ms: int,
) -> Envelope:
    """The same from a command name and plain params (the runtime's ``SendCommand``);
    params the contract refuses raise ``PayloadError``."""
    obj = {
        "id": id,
        "ts": ts_ms,
        "cmd": cmd,
        "params": dict(params),
        "prio": prio,
        "ttl_ms": ttl_ms,
    }

    def encode_params() -> bytes:
        return encode(validate(COMMAND_ADAPTER, obj).params)

    fast = command_bytes(
        _PARAMS, cmd, params, id=id, ts_ms=ts_ms, prio=prio, ttl_ms=ttl_ms,
        encode_params=encode_params,
    )  # fmt: skip
    if fast is not None:
        return Envelope(id, cmd, fast, ttl_ms)
    model = validate(COMMAND_ADAPTER, obj)
    return Envelope(id, model.cmd, snlp.encode_command(model), ttl_ms)


# (cmd, params) → validated params JSON: a lesson's commands repeat (topics.fastwire)
_PARAMS: ParamsCache = {}


def status_payload(online: bool, *, ts_ms: int) -> bytes:
    """The retained ``status`` the gateway writes for a board without an LWT."""
    return encode(snlp.BoardStatus(online=online, ts=ts_ms, by="gateway"))


def presence_task_event(dev: str, online: bool, *, ts_ms: int) -> bytes:
    """``presence.changed`` on ``snlpgw/v1/task/{dev}``."""
    return encode(PresenceChanged(ts=ts_ms, device=dev, data=PresenceData(online=online)))
