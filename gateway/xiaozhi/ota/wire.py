"""The OTA wire format the xiaozhi firmware expects (reference §2), pure functions.

Requests: headers ``Device-Id`` (the MAC), ``Client-Id`` (a UUID kept in the board's NVS),
``User-Agent`` (``<board>/<version>``), ``Activation-Version`` (``2`` when the board has a serial
number and an HMAC key in efuse, then also ``Serial-Number``); a body that names another MAC
than the header is refused. Answers: the ``mqtt`` object (endpoint,
``GID_<board>@@@{dev}@@@<uuid>`` client id, username ``{dev}``, password, per-device topics,
keep-alive), ``server_time`` and ``firmware``; or instead of ``mqtt`` an ``activation`` object
``{message, code, challenge, timeout_ms}``: the firmware shows/speaks the code, then POSTs
``<ota url>/activate`` (body ``{}``, or ``{algorithm, serial_number, challenge, hmac}`` with
``hmac`` = hex HMAC-SHA256(efuse key, challenge); py-xiaozhi wraps it in ``{"Payload": …}``)
every few seconds; 202 means "not yet", 200 "activated, ask OTA again".
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from gateway.settings import Settings
from gateway.xiaozhi.ota.trust import Activation
from topics.errors import PayloadError, PayloadReason
from topics.tree import build_xiaozhi_topic
from topics.wire import load_json

OTA_PATHS = ("/xiaozhi/ota/", "/xiaozhi/ota")
ACTIVATE_PATHS = ("/xiaozhi/ota/activate", "/xiaozhi/ota/activate/")
ACTIVATION_MESSAGE = "Ask a parent to approve this device with code {code}"
ACTIVATE_STATUS = {  # HTTP status of /xiaozhi/ota/activate by outcome
    Activation.DONE: 200,
    Activation.PENDING: 202,
    Activation.UNKNOWN: 404,
    Activation.BAD_HMAC: 403,
}
_SERIAL_RE = re.compile(r"[\x21-\x7e]{1,64}")  # printable, no spaces
_FIELD_MAX = 128
_MAC_RE = re.compile(r"[0-9A-Fa-f]{2}([:-])[0-9A-Fa-f]{2}(\1[0-9A-Fa-f]{2}){4}")
_BOARD_RE = re.compile(r"[^A-Za-z0-9_.\-]")
_BOARD_MAX = 64


class OtaRefused(ValueError):
    """A request we answer with 400 and ``{"error": message}``."""


def device_id_from_mac(mac: str | None) -> str:
    """``AA:BB:CC:DD:EE:FF`` → ``aa_bb_cc_dd_ee_ff``; refuses malformed and non-unicast MACs."""
    if not mac:
        raise OtaRefused("missing Device-Id header (the board's MAC address)")
    text = mac.strip()
    if not _MAC_RE.fullmatch(text):
        raise OtaRefused(f"malformed Device-Id {text[:40]!r}: expected aa:bb:cc:dd:ee:ff")
    octets = bytes.fromhex(re.sub(r"[:-]", "", text))
    if octets[0] & 0x01 or octets == bytes(6):
        raise OtaRefused(f"unknown Device-Id {text!r}: not a unicast device MAC")
    return octets.hex("_")


def board_name(user_agent: str | None) -> str:
    """``<BOARD_NAME>/<version>`` → the board part, ``':'``/``' '`` → ``'_'`` (like the
    reference server), anything else unsafe in a client id → ``'_'``; ``unknown`` if absent."""
    board = (user_agent or "").split("/", 1)[0].strip()
    board = board.replace(":", "_").replace(" ", "_")
    board = _BOARD_RE.sub("_", board)[:_BOARD_MAX]
    return board or "unknown"


def client_uuid(header: str | None) -> str:
    if not header:
        raise OtaRefused("missing Client-Id header (the device's UUID)")
    try:
        return str(uuid.UUID(header.strip()))
    except ValueError:
        raise OtaRefused(f"malformed Client-Id {header[:40]!r}: expected a UUID") from None


def _json_body(body: bytes) -> Any:
    """A request body as JSON, within the bounds every outside JSON gets (``topics.wire``: no
    nesting past ``MAX_JSON_DEPTH``, no lone surrogate); the HTTP server caps its size."""
    try:
        return load_json(body, max_bytes=None)
    except PayloadError as exc:
        if exc.reason is PayloadReason.MALFORMED_JSON:
            raise OtaRefused("body is not JSON") from None
        raise OtaRefused(f"body refused: {exc}") from None


def body_macs(body: bytes) -> list[str]:
    """MACs the system-info body names (firmware ``mac_address``, py-xiaozhi ``board.mac``)."""
    if not body.strip():
        return []
    obj = _json_body(body)
    if not isinstance(obj, dict):
        raise OtaRefused("body must be a JSON object")
    found = [obj.get("mac_address"), obj.get("mac")]
    board = obj.get("board")
    if isinstance(board, dict):
        found.append(board.get("mac"))
    return [m for m in found if m is not None]


def check_body(body: bytes, dev: str) -> None:
    """Refuse a body whose MAC names another device than the ``Device-Id`` header."""
    for mac in body_macs(body):
        if not isinstance(mac, str) or _safe_dev(mac) != dev:
            raise OtaRefused("the body's MAC does not match the Device-Id header")


def serial_number(header: str | None) -> str | None:
    """The ``Serial-Number`` header (32 efuse bytes as text), if sane."""
    text = (header or "").strip()
    return text if _SERIAL_RE.fullmatch(text) else None


@dataclass(frozen=True, slots=True)
class ActivateBody:
    serial: str | None = None
    challenge: str | None = None
    signature: str | None = None


def activate_body(body: bytes) -> ActivateBody:
    """``POST …/activate`` bodies: ``{}`` (no serial), the firmware's flat object, or
    py-xiaozhi's ``{"Payload": {...}}``; anything else is an empty claim."""
    obj = _json_body(body) if body.strip() else {}
    if isinstance(obj, dict) and isinstance(obj.get("Payload"), dict):
        obj = obj["Payload"]
    if not isinstance(obj, dict):
        raise OtaRefused("body must be a JSON object")
    fields = [obj.get(k) for k in ("serial_number", "challenge", "hmac")]
    serial, challenge, signature = (
        f if isinstance(f, str) and 0 < len(f) <= _FIELD_MAX else None for f in fields
    )
    return ActivateBody(serial, challenge, signature)


def activation_response(
    *, code: str, challenge: str, message: str, timeout_ms: int, now_ms: int, firmware: str
) -> dict[str, Any]:
    """The answer that makes a board show ``code`` and poll ``/activate`` (no ``mqtt``)."""
    return {
        "activation": {
            "message": message,
            "code": code,
            "challenge": challenge,
            "timeout_ms": timeout_ms,
        },
        "server_time": _server_time(now_ms),
        "firmware": {"version": firmware, "url": ""},
    }


def mqtt_endpoint(settings: Settings, device_port: int | None = None) -> str:
    """Where boards connect: ``xiaozhi.ota_mqtt_endpoint``; else, when the generated broker
    config has a device listener (``device_port``), that listener on the broker's host (the
    gateway's listener then admits no device user); else the gateway's own broker address."""
    if settings.xiaozhi.ota_mqtt_endpoint:
        return settings.xiaozhi.ota_mqtt_endpoint
    return f"{settings.mqtt.host}:{device_port or settings.mqtt.port}"


def ota_response(
    *,
    settings: Settings,
    endpoint: str,
    dev: str,
    board: str,
    uuid_text: str,
    password: str,
    now_ms: int,
) -> dict[str, Any]:
    """``endpoint``: :func:`mqtt_endpoint`, resolved once by the shell."""
    x = settings.xiaozhi
    return {
        "mqtt": {
            "endpoint": endpoint,
            "client_id": f"GID_{board}@@@{dev}@@@{uuid_text}",
            "username": dev,
            "password": password,
            "publish_topic": build_xiaozhi_topic(x.uplink_topic, dev),
            "subscribe_topic": build_xiaozhi_topic(x.downlink_topic, dev),
            "keepalive": x.ota_keepalive_s,
        },
        "server_time": _server_time(now_ms),
        "firmware": {"version": x.firmware_version, "url": ""},
    }


def _server_time(now_ms: int) -> dict[str, int]:
    return {"timestamp": now_ms, "timezone_offset": (time.localtime().tm_gmtoff or 0) // 60}


def _safe_dev(mac: str) -> str | None:
    try:
        return device_id_from_mac(mac)
    except OtaRefused:
        return None
