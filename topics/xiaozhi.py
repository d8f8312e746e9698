"""Xiaozhi MQTT control JSON (reference/xiaozhi-mqtt-udp.md §4, §6), both directions.

Device → gateway messages (`device-server/{dev}`) ignore unknown keys; gateway → device
messages (`devices/p2p/{dev}`) forbid them. Every device message may carry `session_id`
(`""` when no session is open). MCP request ids sent to the device must be JSON numbers.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, JsonValue, TypeAdapter

from topics.wire import DEFAULT_MAX_BYTES, DeviceModel, OwnModel, encode, load_object, validate

__all__ = [
    "Abort",
    "Alert",
    "AudioParams",
    "DeviceGoodbye",
    "DeviceHello",
    "DeviceMcp",
    "DeviceMessage",
    "DeviceTaskReport",
    "Features",
    "Iot",
    "JsonRpc",
    "Listen",
    "Llm",
    "McpRequest",
    "ModeSet",
    "Ping",
    "ServerGoodbye",
    "ServerHello",
    "ServerMcp",
    "ServerMessage",
    "ServerStep",
    "ServerTask",
    "Stt",
    "System",
    "TextFont",
    "Tts",
    "UdpParams",
    "UdpTimeout",
    "encode_xiaozhi",
    "firmware_accepts_hello",
    "parse_xiaozhi",
    "parse_xiaozhi_downlink",
]

Hex16 = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]  # 16 bytes as lowercase hex
_HEX16 = re.compile(r"[0-9A-Fa-f]{32}")


class AudioParams(DeviceModel):
    format: str = "opus"
    sample_rate: Annotated[int, Field(ge=8000, le=48000)] = 16000
    channels: Annotated[int, Field(ge=1, le=2)] = 1
    frame_duration: Annotated[int, Field(ge=10, le=120)] = 60


class Features(DeviceModel):
    aec: bool | None = None
    mcp: bool | None = None
    glyph_push: bool | None = None


class TextFont(DeviceModel):
    bundle: str | None = None
    charset: str | None = None
    size: int | None = None
    bpp: int | None = None


class JsonRpc(DeviceModel):
    """A JSON-RPC 2.0 message from the device (an MCP response or notification)."""

    jsonrpc: Literal["2.0"]
    id: int | str | None = None
    method: str | None = None
    params: dict[str, JsonValue] | None = None
    result: JsonValue = None
    error: dict[str, JsonValue] | None = None


class _FromDevice(DeviceModel):
    session_id: str | None = None


class DeviceHello(_FromDevice):
    type: Literal["hello"]
    version: int
    transport: str
    features: Features = Features()
    audio_params: AudioParams
    text_font: TextFont | None = None


class Listen(_FromDevice):
    type: Literal["listen"]
    state: Literal["start", "stop", "detect"]
    mode: Literal["auto", "manual", "realtime"] | None = None
    text: str | None = None


class Abort(_FromDevice):
    type: Literal["abort"]
    reason: str | None = None


class DeviceMcp(_FromDevice):
    type: Literal["mcp"]
    payload: JsonRpc


class DeviceGoodbye(_FromDevice):
    type: Literal["goodbye"]


class UdpTimeout(_FromDevice):
    type: Literal["udp_timeout"]


class Ping(_FromDevice):
    type: Literal["ping"]


class Iot(_FromDevice):
    """Legacy (firmware ≤ v1.7) IoT descriptors/states; accepted and typed, not acted on."""

    type: Literal["iot"]
    update: bool | None = None
    descriptors: list[dict[str, JsonValue]] | None = None
    states: list[dict[str, JsonValue]] | None = None


TaskRef = Annotated[str, Field(min_length=1, max_length=128)]
TaskReportType = Literal[
    "task.started",
    "task.completed",
    "task.failed",
    "step.started",
    "step.completed",
    "step.failed",
    "audio.play.completed",
    "speech.started",
    "speech.stopped",
]


class DeviceTaskReport(_FromDevice):
    """The device's task executor reporting (client-architecture plan §11, Phase 2).

    Counted; the gateway's own clock and VAD step the task, so nothing waits for these.
    """

    type: TaskReportType
    task_instance_id: TaskRef | None = None
    step_id: TaskRef | None = None


DeviceMessage = Annotated[
    DeviceHello
    | Listen
    | Abort
    | DeviceMcp
    | DeviceGoodbye
    | UdpTimeout
    | Ping
    | Iot
    | DeviceTaskReport,
    Field(discriminator="type"),
]


class UdpParams(OwnModel):
    server: Annotated[str, Field(min_length=1, max_length=253)]
    port: Annotated[int, Field(ge=1, le=65535)]
    encryption: Literal["aes-128-ctr"] = "aes-128-ctr"
    key: Hex16
    nonce: Hex16


class ServerHello(OwnModel):
    type: Literal["hello"] = "hello"
    version: Literal[3] = 3
    session_id: Annotated[str, Field(min_length=1, max_length=64)]
    transport: Literal["udp"] = "udp"
    udp: UdpParams
    audio_params: AudioParams = AudioParams()


class ServerGoodbye(OwnModel):
    type: Literal["goodbye"] = "goodbye"
    session_id: str


class Tts(OwnModel):
    type: Literal["tts"] = "tts"
    state: Literal["start", "stop", "sentence_start"]
    text: str | None = None
    session_id: str | None = None


class Stt(OwnModel):
    type: Literal["stt"] = "stt"
    text: str
    session_id: str | None = None


class Llm(OwnModel):
    type: Literal["llm"] = "llm"
    emotion: str
    text: str | None = None
    session_id: str | None = None


class McpRequest(OwnModel):
    """A JSON-RPC request (numeric `id`) or notification (no `id`) for the device's MCP server."""

    jsonrpc: Literal["2.0"] = "2.0"
    id: Annotated[int, Field(ge=0)] | None = None
    method: Annotated[str, Field(min_length=1)]
    params: dict[str, JsonValue] | None = None


class ServerMcp(OwnModel):
    type: Literal["mcp"] = "mcp"
    payload: McpRequest
    session_id: str | None = None


class System(OwnModel):
    type: Literal["system"] = "system"
    command: Literal["reboot"]


class Alert(OwnModel):
    type: Literal["alert"] = "alert"
    status: str
    message: str
    emotion: str


TaskMode = Literal["CHAT", "PLAY_AUDIO", "SHADOWING", "FOLLOW_READ", "LISTEN"]


class ModeSet(OwnModel):
    """The device's interaction mode (plan §11): CHAT, or the running task's mode."""

    type: Literal["mode.set"] = "mode.set"
    session_id: str
    mode: TaskMode
    task_instance_id: TaskRef | None = None
    step_id: TaskRef | None = None


class ServerTask(OwnModel):
    """A task's lifecycle for the device's executor (plan §11; D14 task_control)."""

    type: Literal["task.start", "task.stop", "task.pause", "task.resume"]
    session_id: str
    task_instance_id: TaskRef
    step_id: TaskRef | None = None
    app_id: TaskRef | None = None
    task_id: TaskRef | None = None
    lesson_id: TaskRef | None = None
    reason: TaskRef | None = None


class ServerStep(OwnModel):
    """A step begins: ``play`` (a clip; the microphone is not the task's) or ``listen`` (the
    device streams its microphone for ``timeout_ms``, or until the next step / task message)."""

    type: Literal["step.start"] = "step.start"
    session_id: str
    task_instance_id: TaskRef
    step_id: TaskRef
    action: Literal["play", "listen"]
    timeout_ms: Annotated[int, Field(ge=0)] | None = None


ServerMessage = Annotated[
    ServerHello
    | ServerGoodbye
    | Tts
    | Stt
    | Llm
    | ServerMcp
    | System
    | Alert
    | ModeSet
    | ServerTask
    | ServerStep,
    Field(discriminator="type"),
]
DEVICE_ADAPTER: TypeAdapter[DeviceMessage] = TypeAdapter(DeviceMessage)
SERVER_ADAPTER: TypeAdapter[ServerMessage] = TypeAdapter(ServerMessage)


def parse_xiaozhi(payload: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> DeviceMessage:
    """A device's control JSON → typed message, or `PayloadError`."""
    return validate(DEVICE_ADAPTER, load_object(payload, max_bytes=max_bytes))


def parse_xiaozhi_downlink(payload: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> ServerMessage:
    """Gateway → device JSON → typed message (device simulators, tests)."""
    return validate(SERVER_ADAPTER, load_object(payload, max_bytes=max_bytes))


def encode_xiaozhi(message: DeviceMessage | ServerMessage) -> bytes:
    return encode(message)


def firmware_accepts_hello(obj: dict[str, Any]) -> bool:
    """Mirror of firmware v2.4 `MqttProtocol::ParseServerHello` (reference §4.2).

    The firmware merely skips a non-string `session_id`, but then can never match a goodbye,
    so a usable hello needs one: we require it. `version` and `udp.encryption` are ignored.
    """
    udp = obj.get("udp")
    if obj.get("type") != "hello" or obj.get("transport") != "udp":
        return False
    if not isinstance(obj.get("session_id"), str) or not isinstance(udp, dict):
        return False
    port = udp.get("port")
    return (
        isinstance(udp.get("server"), str)
        and isinstance(port, int)
        and not isinstance(port, bool)
        and 1 <= port <= 65535
        and all(isinstance(udp.get(k), str) and _HEX16.fullmatch(udp[k]) for k in ("key", "nonce"))
    )
