"""What the gateway last learnt of each Xiaozhi device: its hello ``features`` and its MCP tools.

A pure core (events and the wall-clock ``now`` in, a :class:`Cut` out; no I/O). The control
shell (:mod:`control`) tells it each accepted hello and each MCP answer from a device; the
admin listener serves a device's record (``GET /admin/devices/{dev}/status``, :mod:`status_admin`).

The tool list is the device's answer to ``tools/list``, whoever asked: a bridged xiaozhi server
(v0.9.6 at every connect: ``initialize``, then ``tools/list``) or the gateway itself. An answer
is recognised by its ``result.tools`` list (MCP ``ListToolsResult``). The firmware pages a long
list (``McpServer::GetToolsList``: ~8 KB a page, ``nextCursor`` = the name of the next page's
first tool), so a page whose first tool is the awaited cursor continues the list; any other
answer replaces it.

Bounds, each cut counted in the record and in the returned :class:`Cut`:

* devices: at most ``max_devices``; a new one evicts the least recently heard;
* tools: at most ``max_tools`` per device, their summaries at most ``max_bytes`` (UTF-8 JSON);
  the tools past either bound, and malformed entries, are cut;
* text: a name 64 characters, a description 512, a parameter's type 32, 32 parameters a tool;
  longer is shortened (counted as ``text``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

MAX_TOOLS = 64
MAX_BYTES = 16 * 1024
_NAME_CHARS = 64
_DESCRIPTION_CHARS = 512
_TYPE_CHARS = 32
_PARAMS = 32


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    type: str  # the JSON Schema ``type`` ("integer", "string|null"), "" when none is given
    required: bool


@dataclass(frozen=True, slots=True)
class ToolSummary:
    name: str
    description: str
    params: tuple[Param, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "params": [
                {"name": p.name, "type": p.type, "required": p.required} for p in self.params
            ],
        }

    @property
    def size(self) -> int:
        """Bytes this summary costs against ``max_bytes`` (its compact UTF-8 JSON)."""
        return len(json.dumps(self.as_json(), ensure_ascii=False, separators=(",", ":")).encode())


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    features: tuple[tuple[str, bool], ...] = ()
    hello_at: float | None = None  # wall clock (epoch seconds) of the last accepted hello
    tools: tuple[ToolSummary, ...] = ()
    tools_at: float | None = None  # of the last ``tools/list`` answer (page)
    tools_cut: int = 0  # tools not kept (over a bound, or malformed), over the list's pages
    text_cut: int = 0  # names, descriptions, types, parameter lists shortened
    size: int = 0  # bytes of ``tools``' summaries
    next_cursor: str | None = None  # the page the device announced next

    def as_json(self) -> dict[str, Any]:
        return {
            "features": dict(self.features),
            "hello_at": self.hello_at,
            "mcp": {
                "tools": [tool.as_json() for tool in self.tools],
                "seen_at": self.tools_at,
                "complete": self.tools_at is not None and self.next_cursor is None,
                "cut": {"tools": self.tools_cut, "text": self.text_cut},
                "bytes": self.size,
            },
        }


@dataclass(frozen=True, slots=True)
class Cut:
    """What one event cut, for the shell's counters."""

    tools: int = 0
    text: int = 0
    devices: int = 0


NOTHING_CUT = Cut()


class StatusBook:
    def __init__(
        self, *, max_devices: int, max_tools: int = MAX_TOOLS, max_bytes: int = MAX_BYTES
    ) -> None:
        if max_devices < 1 or max_tools < 1 or max_bytes < 1:
            raise ValueError("max_devices, max_tools and max_bytes must be at least 1")
        self.max_devices = max_devices
        self.max_tools = max_tools
        self.max_bytes = max_bytes
        self._records: dict[str, DeviceStatus] = {}  # least recently heard first

    def __len__(self) -> int:
        return len(self._records)

    def get(self, dev: str) -> DeviceStatus | None:
        return self._records.get(dev)

    def forget(self, dev: str) -> bool:
        return self._records.pop(dev, None) is not None

    def hello(self, dev: str, features: Mapping[str, bool], now: float) -> Cut:
        """An accepted hello: its features (the wire model's few flags) replace the device's;
        its tools stay until the next ``tools/list`` answer (a re-hello changes no tool)."""
        record, evicted = self._take(dev)
        self._records[dev] = replace(record, features=tuple(sorted(features.items())), hello_at=now)
        return Cut(devices=evicted)

    def mcp_answer(self, dev: str, payload: Mapping[str, Any], now: float) -> Cut | None:
        """A device's JSON-RPC answer; ``None`` when it is not a ``tools/list`` answer."""
        result = payload.get("result")
        if "method" in payload or not isinstance(result, Mapping):
            return None
        tools = result.get("tools")
        if not isinstance(tools, list):
            return None
        record, evicted = self._take(dev)
        if not (tools and record.next_cursor is not None and _name(tools[0]) == record.next_cursor):
            record = DeviceStatus(features=record.features, hello_at=record.hello_at)
        kept, size = list(record.tools), record.size
        cut_tools = text = 0
        for entry in tools:
            tool, shortened = _summary(entry)
            text += shortened
            if tool is None or len(kept) >= self.max_tools or size + tool.size > self.max_bytes:
                cut_tools += 1
                continue
            kept.append(tool)
            size += tool.size
        cursor = result.get("nextCursor")
        self._records[dev] = replace(
            record,
            tools=tuple(kept),
            tools_at=now,
            tools_cut=record.tools_cut + cut_tools,
            text_cut=record.text_cut + text,
            size=size,
            next_cursor=cursor if isinstance(cursor, str) and cursor else None,
        )
        return Cut(tools=cut_tools, text=text, devices=evicted)

    def _take(self, dev: str) -> tuple[DeviceStatus, int]:
        """The device's record, taken out (re-inserted last: most recently heard); a new one
        evicts the least recently heard when the book is full (the count evicted)."""
        record = self._records.pop(dev, None)
        if record is not None:
            return record, 0
        evicted = 0
        if len(self._records) >= self.max_devices:
            del self._records[next(iter(self._records))]
            evicted = 1
        return DeviceStatus(), evicted


def _name(entry: object) -> str | None:
    if isinstance(entry, Mapping):
        name = entry.get("name")
        if isinstance(name, str):
            return name
    return None


def _clip(text: str, limit: int) -> tuple[str, int]:
    return (text, 0) if len(text) <= limit else (text[:limit], 1)


def _summary(entry: object) -> tuple[ToolSummary | None, int]:
    """A tool's summary and how many of its texts were shortened; ``None``: malformed."""
    name = _name(entry)
    if not isinstance(entry, Mapping) or not name:
        return None, 0
    name, cut = _clip(name, _NAME_CHARS)
    raw = entry.get("description")
    description, shortened = _clip(raw if isinstance(raw, str) else "", _DESCRIPTION_CHARS)
    cut += shortened
    schema = entry.get("inputSchema")
    schema = schema if isinstance(schema, Mapping) else {}
    props = schema.get("properties")
    props = props if isinstance(props, Mapping) else {}
    required = schema.get("required")
    required = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
    params: list[Param] = []
    for key, spec in props.items():
        if len(params) >= _PARAMS:
            cut += 1
            break
        pname, shortened = _clip(str(key), _NAME_CHARS)
        cut += shortened
        ptype, shortened = _clip(_type_of(spec), _TYPE_CHARS)
        cut += shortened
        params.append(Param(pname, ptype, key in required))
    return ToolSummary(name, description, tuple(params)), cut


def _type_of(spec: object) -> str:
    kind = spec.get("type") if isinstance(spec, Mapping) else None
    if isinstance(kind, str):
        return kind
    if isinstance(kind, list):
        return "|".join(k for k in kind if isinstance(k, str))
    return ""
