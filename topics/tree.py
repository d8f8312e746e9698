"""The topic tree of SPEC §3: builders, parsers and the gateway's subscription filters.

Device ids are board MACs in lowercase with underscores (`aa_bb_cc_dd_ee_ff`), which are also
the boards' MQTT usernames; gateway ids are short names. Xiaozhi topics are templates from
settings with one `{dev}` level (`device-server/{dev}`, `devices/p2p/{dev}`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from topics.errors import TopicError

__all__ = [
    "DELIVERY",
    "DEVICE_ID_RE",
    "GATEWAY_ID_RE",
    "XIAOZHI_DELIVERY",
    "Delivery",
    "Topic",
    "TopicKind",
    "build_topic",
    "build_xiaozhi_topic",
    "gateway_filters",
    "mac_colon",
    "normalize_mac",
    "parse_topic",
    "parse_xiaozhi_topic",
    "validate_device_id",
    "validate_gateway_id",
    "validate_template",
    "xiaozhi_filter",
]

DEVICE_ID_RE = re.compile(r"[0-9a-f]{2}(_[0-9a-f]{2}){5}")
GATEWAY_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_MAC_RE = re.compile(r"[0-9A-Fa-f]{2}([:_-]?)[0-9A-Fa-f]{2}(\1[0-9A-Fa-f]{2}){4}")
_DEV = "{dev}"
_K = TypeVar("_K")
_V = TypeVar("_V")


class TopicKind(StrEnum):
    """Every topic of SPEC §3."""

    CMD = "cmd"
    ACK = "ack"
    RPT = "rpt"
    EVT = "evt"
    HB = "hb"
    STATUS = "status"
    CTL = "ctl"
    REPLY = "reply"
    TASK = "task"
    ASSESSMENT = "assessment"
    OPS_METRICS = "ops.metrics"
    OPS_EVENTS = "ops.events"
    GW_STATUS = "gw.status"


SNLP_KINDS = frozenset(
    {TopicKind.CMD, TopicKind.ACK, TopicKind.RPT, TopicKind.EVT, TopicKind.HB, TopicKind.STATUS}
)
BACKEND_KINDS = frozenset({TopicKind.CTL, TopicKind.REPLY, TopicKind.TASK, TopicKind.ASSESSMENT})
GATEWAY_KINDS = frozenset({TopicKind.OPS_METRICS, TopicKind.OPS_EVENTS, TopicKind.GW_STATUS})


@dataclass(frozen=True, slots=True)
class Delivery:
    """MQTT QoS and retain flag of a topic (SPEC §3 table)."""

    qos: int
    retain: bool


DELIVERY: dict[TopicKind, Delivery] = {
    TopicKind.CMD: Delivery(1, False),
    TopicKind.ACK: Delivery(1, False),
    TopicKind.RPT: Delivery(1, False),  # boards send progress at QoS 0, the final report at 1
    TopicKind.EVT: Delivery(1, False),
    TopicKind.HB: Delivery(0, False),
    TopicKind.STATUS: Delivery(1, True),
    TopicKind.CTL: Delivery(1, False),
    TopicKind.REPLY: Delivery(1, False),
    TopicKind.TASK: Delivery(1, False),
    TopicKind.ASSESSMENT: Delivery(1, False),
    TopicKind.OPS_METRICS: Delivery(0, True),
    TopicKind.OPS_EVENTS: Delivery(1, False),
    TopicKind.GW_STATUS: Delivery(1, True),
}
XIAOZHI_DELIVERY = Delivery(0, False)  # stock firmware publishes QoS 0 only


def validate_device_id(dev: str) -> str:
    if not isinstance(dev, str) or not DEVICE_ID_RE.fullmatch(dev):
        raise TopicError(str(dev), "device id must be a lowercase MAC with underscores")
    return dev


def validate_gateway_id(gw: str) -> str:
    if not isinstance(gw, str) or not GATEWAY_ID_RE.fullmatch(gw):
        raise TopicError(str(gw), "gateway id must match [A-Za-z0-9_-]{1,64}")
    return gw


def normalize_mac(mac: str) -> str:
    """`AA:BB:CC:DD:EE:FF`, `aa-bb-…`, `aabbcc…` → the device id `aa_bb_cc_dd_ee_ff`."""
    text = mac.strip() if isinstance(mac, str) else ""
    if not _MAC_RE.fullmatch(text):
        raise TopicError(str(mac), "not a MAC address")
    digits = re.sub(r"[:_-]", "", text).lower()
    return "_".join(digits[i : i + 2] for i in range(0, 12, 2))


def mac_colon(dev: str) -> str:
    """Device id → the firmware's `aa:bb:cc:dd:ee:ff` form (OTA `Device-Id` header)."""
    return validate_device_id(dev).replace("_", ":")


@dataclass(frozen=True, slots=True)
class Topic:
    """A parsed topic: its kind and the device or gateway id it names."""

    kind: TopicKind
    dev: str | None = None
    gw: str | None = None

    def __post_init__(self) -> None:
        if self.kind in GATEWAY_KINDS:
            if self.gw is None or self.dev is not None:
                raise TopicError(str(self.kind), "gateway topics take a gateway id only")
            validate_gateway_id(self.gw)
        else:
            if self.dev is None or self.gw is not None:
                raise TopicError(str(self.kind), "device topics take a device id only")
            validate_device_id(self.dev)

    @property
    def name(self) -> str:
        match self.kind:
            case TopicKind.OPS_METRICS | TopicKind.OPS_EVENTS:
                return f"snlpgw/v1/ops/{self.gw}/{self.kind.value.removeprefix('ops.')}"
            case TopicKind.GW_STATUS:
                return f"snlpgw/v1/gw/{self.gw}/status"
            case k if k in BACKEND_KINDS:
                return f"snlpgw/v1/{k.value}/{self.dev}"
            case k:
                return f"snlp/v1/{self.dev}/{k.value}"

    def __str__(self) -> str:
        return self.name


# Hot-path memos (every command, ack and task event builds or parses a topic): successes only,
# so errors are raised as before; bounded, all forgotten when full (a device id appears in a
# handful of topics, so this holds every topic of ~10,000 devices).
TOPICS_KEPT = 65_536
_BUILT: dict[tuple[TopicKind, str | None, str | None], str] = {}
_PARSED: dict[str, Topic] = {}


def _remember(memo: dict[_K, _V], key: _K, value: _V) -> _V:
    if len(memo) >= TOPICS_KEPT:
        memo.clear()
    memo[key] = value
    return value


def build_topic(kind: TopicKind, *, dev: str | None = None, gw: str | None = None) -> str:
    name = _BUILT.get((kind, dev, gw))
    if name is None:
        name = _remember(_BUILT, (kind, dev, gw), Topic(kind, dev=dev, gw=gw).name)
    return name


def _levels(topic: str) -> list[str]:
    if not isinstance(topic, str) or not topic:
        raise TopicError(str(topic), "empty topic")
    if any(c in topic for c in "+#\x00"):
        raise TopicError(topic, "wildcards are not allowed in a topic name")
    return topic.split("/")


def parse_topic(topic: str) -> Topic:
    """Parse any snlp/v1 or snlpgw/v1 topic name; raise `TopicError` if it is not in the tree."""
    parsed = _PARSED.get(topic) if type(topic) is str else None
    if parsed is None:
        parsed = _remember(_PARSED, topic, _parse_topic(topic))
    return parsed


def _parse_topic(topic: str) -> Topic:
    levels = _levels(topic)
    match levels:
        case ["snlp", "v1", dev, kind] if kind in {k.value for k in SNLP_KINDS}:
            return _make(topic, TopicKind(kind), dev=dev)
        case ["snlpgw", "v1", "ops", gw, ("metrics" | "events") as what]:
            return _make(topic, TopicKind(f"ops.{what}"), gw=gw)
        case ["snlpgw", "v1", "gw", gw, "status"]:
            return _make(topic, TopicKind.GW_STATUS, gw=gw)
        case ["snlpgw", "v1", kind, dev] if kind in {k.value for k in BACKEND_KINDS}:
            return _make(topic, TopicKind(kind), dev=dev)
        case ["snlp" | "snlpgw", "v1", *_]:
            raise TopicError(topic, f"unknown kind or wrong level count ({len(levels)})")
        case _:
            raise TopicError(topic, "not an snlp/v1 or snlpgw/v1 topic")


def _make(topic: str, kind: TopicKind, *, dev: str | None = None, gw: str | None = None) -> Topic:
    try:
        return Topic(kind, dev=dev, gw=gw)
    except TopicError as exc:
        raise TopicError(topic, exc.detail) from None


REPLY_TREE = "snlpgw/v1/reply/"
_REPLY_LEVEL_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def valid_response_topic(topic: str) -> bool:
    """Whether a control request's MQTT 5 Response Topic may be answered: a topic name (no
    wildcard) in the reply tree backends may read, ``snlpgw/v1/reply/<one level>`` with that
    level of ``[A-Za-z0-9_.-]{1,64}``. Anything else would have the gateway publish where the
    requester told it to: a wildcard disconnects the gateway, another tree is not the
    requester's to write through the gateway."""
    if not topic.startswith(REPLY_TREE):
        return False
    return _REPLY_LEVEL_RE.fullmatch(topic[len(REPLY_TREE) :]) is not None


def validate_template(template: str) -> str:
    """A Xiaozhi topic template: `{dev}` exactly once, as a whole level, no wildcards."""
    levels = _levels(template)
    if levels.count(_DEV) != 1 or template.count("{") != 1 or template.count("}") != 1:
        raise TopicError(template, "template needs exactly one whole '{dev}' level")
    if any(not level for level in levels):
        raise TopicError(template, "empty topic level")
    return template


def build_xiaozhi_topic(template: str, dev: str) -> str:
    return validate_template(template).replace(_DEV, validate_device_id(dev))


def parse_xiaozhi_topic(template: str, topic: str) -> str:
    """The device id in `topic` if it matches `template`, else `TopicError`."""
    want = validate_template(template).split("/")
    got = _levels(topic)
    if len(got) != len(want):
        raise TopicError(topic, f"expected {len(want)} levels like {template!r}")
    dev = ""
    for pattern, level in zip(want, got, strict=True):
        if pattern == _DEV:
            dev = level
        elif pattern != level:
            raise TopicError(topic, f"does not match {template!r}")
    try:
        return validate_device_id(dev)
    except TopicError as exc:
        raise TopicError(topic, exc.detail) from None


def xiaozhi_filter(template: str) -> str:
    return validate_template(template).replace(_DEV, "+")


def gateway_filters(uplink_template: str, *, share_group: str | None = None) -> tuple[str, ...]:
    """What the gateway subscribes to; with `share_group`, as MQTT 5 shared subscriptions."""
    filters = (
        *(
            f"snlp/v1/+/{k.value}"
            for k in (TopicKind.ACK, TopicKind.RPT, TopicKind.EVT, TopicKind.HB, TopicKind.STATUS)
        ),
        "snlpgw/v1/ctl/+",
        xiaozhi_filter(uplink_template),
    )
    if share_group is None:
        return filters
    validate_gateway_id(share_group)
    return tuple(f"$share/{share_group}/{f}" for f in filters)
