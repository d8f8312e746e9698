"""Gateway ↔ backend payloads: control requests and replies, task lifecycle, assessments.

All are our own contract: unknown keys are refused, `v` is 1. Assessment output is a list of
`{"method", "value"}` numbers only; nothing here carries a verdict (SPEC §2.4).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, JsonValue, TypeAdapter, model_validator

from topics.ops import GatewayStatus, OpsEvent, OpsMetrics
from topics.tree import DEVICE_ID_RE, TopicKind
from topics.wire import (
    DEFAULT_MAX_BYTES,
    EpochMs,
    Id,
    OwnModel,
    check_version,
    load_object,
    validate,
)

__all__ = [
    "SNLPGW_KINDS",
    "Assessment",
    "CtlReply",
    "CtlRequest",
    "InstanceCancelled",
    "InstanceSignalsData",
    "InstanceSignalsEvent",
    "Metric",
    "PresenceChanged",
    "SnlpgwMessage",
    "StepSignalsData",
    "StepSignalsEvent",
    "TaskEvent",
    "TaskEventMessage",
    "TaskLifecycle",
    "WindowClosed",
    "WindowOpened",
    "parse_ctl_request",
    "parse_snlpgw",
]

DeviceId = Annotated[str, Field(pattern=f"^{DEVICE_ID_RE.pattern}$")]
Name = Annotated[str, Field(min_length=1, max_length=128)]
# ``sync``: put the named lesson's audio on the board's SD card (DOWNLOAD; gateway.content.sync);
# ``volume``: the device's volume from the next PLAY_MEDIA on (params.volume 0-100)
Action = Literal["start", "pause", "resume", "stop", "restart", "sync", "volume"]
RefusalReason = Literal[
    "busy", "unknown_task", "device_offline", "invalid", "no_instance", "internal", "overloaded"
]


class CtlRequest(OwnModel):
    """Backend → gateway on `snlpgw/v1/ctl/{dev}`."""

    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"action": {"enum": ["start", "sync"]}}},
            "then": {"required": ["app_id", "task_id"]},
        }
    )

    v: Literal[1]
    id: Id
    action: Action
    app_id: Name | None = None
    task_id: Name | None = None
    lesson_id: Name | None = None
    instance_id: Id | None = None
    params: dict[str, JsonValue] | None = None
    priority: Literal[1, 2, 3] = 3
    source: Name | None = None

    @model_validator(mode="after")
    def _start_names_a_task(self) -> CtlRequest:
        if self.action in ("start", "sync") and (self.app_id is None or self.task_id is None):
            raise ValueError(f"{self.action} needs app_id and task_id")
        return self


class CtlReply(OwnModel):
    """Gateway → backend on `snlpgw/v1/reply/{dev}`; `ref`/`action` null if the request was unreadable."""

    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"status": {"const": "refused"}}},
            "then": {"required": ["reason"], "properties": {"reason": {"type": "string"}}},
            "else": {"properties": {"reason": {"type": "null"}}},
        }
    )
    _keep_null = frozenset({"ref", "action"})
    v: Literal[1] = 1
    ref: Id | None
    device: DeviceId
    action: Action | None
    status: Literal["accepted", "refused"]
    instance_id: Id | None = None
    reason: RefusalReason | None = None
    running_priority: int | None = None
    detail: Annotated[str, Field(max_length=256)] | None = None
    ts: EpochMs

    @model_validator(mode="after")
    def _refusal_has_reason(self) -> CtlReply:
        if (self.status == "refused") != (self.reason is not None):
            raise ValueError("reason is required when refused and only then")
        return self


class TaskEvent(OwnModel):
    """Gateway → backend on `snlpgw/v1/task/{dev}`; subclasses fix `event` and `data`."""

    v: Literal[1] = 1
    ts: EpochMs
    device: DeviceId
    event: str
    instance_id: Id | None = None
    step_index: Annotated[int, Field(ge=0)] | None = None
    data: OwnModel | dict[str, JsonValue]


class WindowOpenedData(OwnModel):
    window_ms: Annotated[int, Field(ge=0)]
    planned_close_ms: EpochMs


class WindowClosedData(OwnModel):
    planned_close_ms: EpochMs
    actual_close_ms: EpochMs
    lateness_ms: int
    window_ms: Annotated[int, Field(ge=0)]


class CancelledData(OwnModel):
    reason: Name


class PresenceData(OwnModel):
    online: bool


class WindowOpened(TaskEvent):
    event: Literal["window.opened"] = "window.opened"
    data: WindowOpenedData


class WindowClosed(TaskEvent):
    event: Literal["window.closed"] = "window.closed"
    data: WindowClosedData


class InstanceCancelled(TaskEvent):
    event: Literal["instance.cancelled"] = "instance.cancelled"
    data: CancelledData


class PresenceChanged(TaskEvent):
    event: Literal["presence.changed"] = "presence.changed"
    data: PresenceData


class StepSignalsData(OwnModel):
    """Behaviour signals of one step of a STEPS task: numbers, never a diagnosis."""

    _keep_null = frozenset({"response_latency_ms"})
    response_latency_ms: Annotated[int, Field(ge=0)] | None  # window open -> speech start
    completed: Literal[0, 1]  # ran to its end with a transcript (0: silence, ASR failed, ...)


class InstanceSignalsData(OwnModel):
    """Behaviour signals of a STEPS task's instance at its end, and its metrics' totals."""

    _keep_null = frozenset({"mean_latency_ms"})
    steps: Annotated[int, Field(ge=0)]
    responded: Annotated[int, Field(ge=0)]
    completed: Annotated[int, Field(ge=0)]
    mean_latency_ms: Annotated[int, Field(ge=0)] | None
    totals: dict[Name, Annotated[float, Field(allow_inf_nan=False)]]


class StepSignalsEvent(TaskEvent):
    event: Literal["step.signals"] = "step.signals"
    data: StepSignalsData


class InstanceSignalsEvent(TaskEvent):
    event: Literal["instance.signals"] = "instance.signals"
    data: InstanceSignalsData


class TaskLifecycle(TaskEvent):
    """The remaining lifecycle events, with free-form (JSON) details."""

    event: Literal[
        "instance.started",
        "instance.paused",
        "instance.resumed",
        "instance.completed",
        "instance.restored",
        "step.played",
        "step.failed",
        "step.skipped",
        "window.confirmed",
        "volume.set",
        "speech.started",
        "speech.stopped",
    ]
    data: dict[str, JsonValue] = Field(default_factory=dict)


TaskEventMessage = Annotated[
    WindowOpened
    | WindowClosed
    | InstanceCancelled
    | PresenceChanged
    | StepSignalsEvent
    | InstanceSignalsEvent
    | TaskLifecycle,
    Field(discriminator="event"),
]
TASK_EVENT_ADAPTER: TypeAdapter[TaskEventMessage] = TypeAdapter(TaskEventMessage)


class Metric(OwnModel):
    method: Name
    value: Annotated[float, Field(allow_inf_nan=False)]


class Assessment(OwnModel):
    """Gateway → backend on `snlpgw/v1/assessment/{dev}` (SPEC §6)."""

    _keep_null = frozenset({"expected_text", "asr_text"})
    v: Literal[1] = 1
    instance_id: Id
    step_index: Annotated[int, Field(ge=0)]
    device: DeviceId
    prompt_text: str
    expected_text: str | None
    asr_text: str | None
    metrics: list[Metric]
    assessed_at: EpochMs
    clip: str | None = None
    ts: EpochMs | None = None


SnlpgwMessage = (
    CtlRequest | CtlReply | TaskEventMessage | Assessment | OpsMetrics | OpsEvent | GatewayStatus
)
_ADAPTERS: dict[TopicKind, TypeAdapter[SnlpgwMessage]] = {
    TopicKind.CTL: TypeAdapter(CtlRequest),
    TopicKind.REPLY: TypeAdapter(CtlReply),
    TopicKind.TASK: TASK_EVENT_ADAPTER,  # type: ignore[dict-item]  # Annotated union adapter
    TopicKind.ASSESSMENT: TypeAdapter(Assessment),
    TopicKind.OPS_METRICS: TypeAdapter(OpsMetrics),
    TopicKind.OPS_EVENTS: TypeAdapter(OpsEvent),
    TopicKind.GW_STATUS: TypeAdapter(GatewayStatus),
}

SNLPGW_KINDS = frozenset(_ADAPTERS)


def parse_snlpgw(
    kind: TopicKind, payload: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> SnlpgwMessage:
    """Parse a payload of an `snlpgw/v1/...` topic; `PayloadError` on any bad payload."""
    adapter = _ADAPTERS.get(kind)
    if adapter is None:
        raise ValueError(f"{kind} is not an snlpgw/v1 topic")
    obj = load_object(payload, max_bytes=max_bytes)
    check_version(obj, required=True)
    return validate(adapter, obj)


def parse_ctl_request(payload: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> CtlRequest:
    """A control request → `CtlRequest`, or `PayloadError` (reply `refused`/`invalid`)."""
    message = parse_snlpgw(TopicKind.CTL, payload, max_bytes=max_bytes)
    assert isinstance(message, CtlRequest)  # noqa: S101 - the CTL adapter returns CtlRequest
    return message
