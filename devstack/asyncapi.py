"""JSON Schemas and the AsyncAPI 3.0 document of the wire contract, generated from the models.

`python -m devstack.asyncapi --write` (`make asyncapi`) regenerates `topics/schemas/*.json` and
`topics/asyncapi.yaml`; `--check` exits 1 when the checked-in files differ from the models.
Dev tooling (it needs pyyaml, a dev dependency): the shipped package holds the generated files. Output is deterministic
(sorted keys). Operations are seen from the gateway: `send` = it publishes, `receive` = it
subscribes.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import TypeAdapter

from topics import backend, ops, snlp, snlp_commands, snlp_events, xiaozhi
from topics.tree import DELIVERY, XIAOZHI_DELIVERY, Delivery, TopicKind

__all__ = ["CHANNELS", "MESSAGES", "Channel", "Message", "generate", "main"]

HERE = Path(__file__).resolve().parent.parent / "topics"
SCHEMA_DIR = HERE / "schemas"
ASYNCAPI_FILE = HERE / "asyncapi.yaml"
_DEV = "Device id: the board MAC, lowercase with underscores, ^[0-9a-f]{2}(_[0-9a-f]{2}){5}$."
_GW = "Gateway instance id, ^[A-Za-z0-9_-]{1,64}$."


@dataclass(frozen=True, slots=True)
class Message:
    name: str  # schema file stem and component id
    target: Any  # a model class or an annotated union
    summary: str


@dataclass(frozen=True, slots=True)
class Channel:
    id: str
    address: str
    action: Literal["send", "receive"]
    delivery: Delivery
    messages: tuple[str, ...]
    description: str


_XZ_UP = {
    "hello": xiaozhi.DeviceHello,
    "listen": xiaozhi.Listen,
    "abort": xiaozhi.Abort,
    "mcp": xiaozhi.DeviceMcp,
    "goodbye": xiaozhi.DeviceGoodbye,
    "udp_timeout": xiaozhi.UdpTimeout,
    "ping": xiaozhi.Ping,
    "iot": xiaozhi.Iot,
    "task_report": xiaozhi.DeviceTaskReport,
}
_XZ_DOWN = {
    "hello": xiaozhi.ServerHello,
    "goodbye": xiaozhi.ServerGoodbye,
    "tts": xiaozhi.Tts,
    "stt": xiaozhi.Stt,
    "llm": xiaozhi.Llm,
    "mcp": xiaozhi.ServerMcp,
    "system": xiaozhi.System,
    "alert": xiaozhi.Alert,
    "mode_set": xiaozhi.ModeSet,
    "task": xiaozhi.ServerTask,
    "step_start": xiaozhi.ServerStep,
}

MESSAGES: tuple[Message, ...] = (
    Message("snlp.command", snlp_commands.AnyCommand, "Command envelope, discriminated on cmd"),
    Message("snlp.ack", snlp.Ack, "Receipt of a command"),
    Message("snlp.report", snlp.Report, "Progress/final result of a long command"),
    Message("snlp.event", snlp_events.AnyEvent, "Board event (legacy text maps to this)"),
    Message("snlp.heartbeat", snlp.Heartbeat, "Board heartbeat"),
    Message("snlp.status", snlp.BoardStatus, "Retained board presence"),
    *(Message(f"xiaozhi.up.{k}", m, f"Device → gateway '{k}'") for k, m in _XZ_UP.items()),
    *(Message(f"xiaozhi.down.{k}", m, f"Gateway → device '{k}'") for k, m in _XZ_DOWN.items()),
    Message("snlpgw.ctl_request", backend.CtlRequest, "Task control request"),
    Message("snlpgw.ctl_reply", backend.CtlReply, "Reply to a control request"),
    Message("snlpgw.task_event", backend.TaskEventMessage, "Task and step lifecycle event"),
    Message("snlpgw.assessment", backend.Assessment, "Assessment result (numbers only)"),
    Message("snlpgw.ops_metrics", ops.OpsMetrics, "Periodic metrics snapshot"),
    Message("snlpgw.ops_event", ops.OpsEvent, "Ops alarm"),
    Message("snlpgw.gateway_status", ops.GatewayStatus, "Retained gateway presence (LWT)"),
)

K = TopicKind
CHANNELS: tuple[Channel, ...] = (
    Channel("snlpCmd", "snlp/v1/{dev}/cmd", "send", DELIVERY[K.CMD], ("snlp.command",), "Commands to a board; resent with the same id until acked or ttl_ms expires."),
    Channel("snlpAck", "snlp/v1/{dev}/ack", "receive", DELIVERY[K.ACK], ("snlp.ack",), "Command receipts."),
    Channel("snlpRpt", "snlp/v1/{dev}/rpt", "receive", DELIVERY[K.RPT], ("snlp.report",), "Reports: progress at QoS 0, the final (stage done) at QoS 1."),
    Channel("snlpEvt", "snlp/v1/{dev}/evt", "receive", DELIVERY[K.EVT], ("snlp.event",), "Board events; legacy `[skill_event]verb|value` text is also accepted."),
    Channel("snlpHb", "snlp/v1/{dev}/hb", "receive", DELIVERY[K.HB], ("snlp.heartbeat",), "Heartbeat every 30 s."),
    Channel("snlpStatus", "snlp/v1/{dev}/status", "receive", DELIVERY[K.STATUS], ("snlp.status",), "Retained presence: the board's LWT, or written by the gateway (by=gateway)."),
    Channel("xiaozhiUp", "device-server/{dev}", "receive", XIAOZHI_DELIVERY, tuple(f"xiaozhi.up.{k}" for k in _XZ_UP), "Xiaozhi control JSON from a device (template from settings: xiaozhi.uplink_topic)."),
    Channel("xiaozhiDown", "devices/p2p/{dev}", "send", XIAOZHI_DELIVERY, tuple(f"xiaozhi.down.{k}" for k in _XZ_DOWN), "Xiaozhi control JSON to a device (template from settings: xiaozhi.downlink_topic)."),
    Channel("ctl", "snlpgw/v1/ctl/{dev}", "receive", DELIVERY[K.CTL], ("snlpgw.ctl_request",), "Task control requests from the backend."),
    Channel("reply", "snlpgw/v1/reply/{dev}", "send", DELIVERY[K.REPLY], ("snlpgw.ctl_reply",), "Replies to control requests; an MQTT 5 response topic is honoured too."),
    Channel("task", "snlpgw/v1/task/{dev}", "send", DELIVERY[K.TASK], ("snlpgw.task_event",), "Task, step, listen-window and VAD lifecycle events."),
    Channel("assessment", "snlpgw/v1/assessment/{dev}", "send", DELIVERY[K.ASSESSMENT], ("snlpgw.assessment",), "Assessment results, published after the step (side path)."),
    Channel("opsMetrics", "snlpgw/v1/ops/{gw}/metrics", "send", DELIVERY[K.OPS_METRICS], ("snlpgw.ops_metrics",), "Retained metrics snapshot every interval_s."),
    Channel("opsEvents", "snlpgw/v1/ops/{gw}/events", "send", DELIVERY[K.OPS_EVENTS], ("snlpgw.ops_event",), "Alarms."),
    Channel("gwStatus", "snlpgw/v1/gw/{gw}/status", "send", DELIVERY[K.GW_STATUS], ("snlpgw.gateway_status",), "Retained gateway presence; also the gateway's LWT (online=false)."),
)  # fmt: skip


def _schema(message: Message) -> dict[str, Any]:
    schema = TypeAdapter(message.target).json_schema(mode="validation")
    schema.setdefault("title", message.name)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"{message.name}.json",
        "description": message.summary,
        **schema,
    }


def _component_id(name: str) -> str:
    return name.replace(".", "_")


def _document() -> dict[str, Any]:
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for ch in CHANNELS:
        params = [p for p in ("dev", "gw") if f"{{{p}}}" in ch.address]
        channels[ch.id] = {
            "address": ch.address,
            "description": ch.description,
            "parameters": {
                p: {"description": _DEV if p == "dev" else _GW}
                | ({"examples": ["aa_bb_cc_dd_ee_ff"]} if p == "dev" else {"examples": ["gw-1"]})
                for p in params
            },
            "messages": {
                _component_id(m): {"$ref": f"#/components/messages/{_component_id(m)}"}
                for m in ch.messages
            },
        }
        operations[f"{ch.action}_{ch.id}"] = {
            "action": ch.action,
            "channel": {"$ref": f"#/channels/{ch.id}"},
            "messages": [
                {"$ref": f"#/channels/{ch.id}/messages/{_component_id(m)}"} for m in ch.messages
            ],
            "bindings": {
                "mqtt": {
                    "qos": ch.delivery.qos,
                    "retain": ch.delivery.retain,
                    "bindingVersion": "0.2.0",
                }
            },
        }
    messages = {
        _component_id(m.name): {
            "name": m.name,
            "summary": m.summary,
            "contentType": "application/json",
            "payload": {"$ref": f"./schemas/{m.name}.json"},
        }
        for m in MESSAGES
    }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "snlp gateway wire contract",
            "version": "1.0.0",
            "description": "snlp/v1 board channel, Xiaozhi MQTT control channel and the "
            "snlpgw/v1 backend/ops topics, from the gateway's point of view. Payloads are "
            "compact JSON of at most 8192 bytes.",
        },
        "defaultContentType": "application/json",
        "servers": {
            "broker": {
                "host": "127.0.0.1:1883",
                "protocol": "mqtt",
                "description": "Mosquitto (boards use MQTT 3.1.1 clean sessions; the gateway MQTT 5).",
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    }


def generate() -> dict[str, str]:
    """Every generated file, as path relative to `topics/` → exact text."""
    files = {
        f"schemas/{m.name}.json": json.dumps(
            _schema(m), indent=2, sort_keys=True, ensure_ascii=False
        )
        + "\n"
        for m in MESSAGES
    }
    files["asyncapi.yaml"] = yaml.safe_dump(
        _document(), sort_keys=True, allow_unicode=True, width=100
    )
    return files


def drift(root: Path = HERE) -> list[str]:
    """Paths whose checked-in text differs from the models, plus stale schema files."""
    files = generate()
    changed = [
        p for p, text in files.items() if not (root / p).is_file() or (root / p).read_text() != text
    ]
    stale = [
        f"schemas/{f.name}"
        for f in sorted((root / "schemas").glob("*.json"))
        if f"schemas/{f.name}" not in files
    ]
    return sorted(changed + stale)


def write(root: Path = HERE) -> None:
    files = generate()
    (root / "schemas").mkdir(parents=True, exist_ok=True)
    for stale in drift(root):
        if stale not in files:
            (root / stale).unlink()
    for path, text in files.items():
        (root / path).write_text(text)


def main(argv: list[str] | None = None, *, root: Path = HERE) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.asyncapi", description=__doc__)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate the files")
    mode.add_argument("--check", action="store_true", help="exit 1 if the files are stale")
    args = parser.parse_args(argv)
    if args.write:
        write(root)
        return 0
    stale = drift(root)
    for path in stale:
        sys.stderr.write(f"out of date: topics/{path}\n")
    if stale:
        sys.stderr.write("run: python -m devstack.asyncapi --write\n")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
