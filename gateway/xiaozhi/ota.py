"""``POST|GET /xiaozhi/ota/``: device provisioning the way xiaozhi firmware expects (ref. §2).

The ``Device-Id`` header (the board's MAC) decides whose credentials are created or rotated;
a body that names another MAC is refused, so a device never receives another device's secret.
The answer carries the ``mqtt`` object (endpoint, ``GID_<board>@@@{dev}@@@<uuid>`` client id,
username ``{dev}``, a fresh password, per-device topics, keep-alive), ``server_time`` and
``firmware``, and deliberately no ``activation`` object (its presence starts activation).
Provisioning touches files and signals the broker, so it runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlsplit

from aiohttp import web

from gateway.http import HttpServer
from gateway.settings import Settings
from gateway.xiaozhi.stats import ChannelStats
from topics.tree import build_xiaozhi_topic

log = logging.getLogger(__name__)

OTA_PATHS = ("/xiaozhi/ota/", "/xiaozhi/ota")
_MAC_RE = re.compile(r"[0-9A-Fa-f]{2}([:-])[0-9A-Fa-f]{2}(\1[0-9A-Fa-f]{2}){4}")
_BOARD_RE = re.compile(r"[^A-Za-z0-9_.\-]")
_BOARD_MAX = 64


class ProvisionedCredentials(Protocol):
    @property
    def username(self) -> str: ...

    @property
    def password(self) -> str | None: ...


Provisioner = Callable[[str], ProvisionedCredentials]
"""Create or rotate a device's broker user (blocking; called in a worker thread)."""


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


def body_macs(body: bytes) -> list[str]:
    """MACs the system-info body names (firmware ``mac_address``, py-xiaozhi ``board.mac``)."""
    if not body.strip():
        return []
    try:
        obj = json.loads(body)
    except ValueError:
        raise OtaRefused("body is not JSON") from None
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


def mqtt_endpoint(settings: Settings) -> str:
    if settings.xiaozhi.ota_mqtt_endpoint:
        return settings.xiaozhi.ota_mqtt_endpoint
    parts = urlsplit(settings.mqtt.url)
    return f"{parts.hostname}:{settings.mqtt.port}"


def ota_response(
    *, settings: Settings, dev: str, board: str, uuid_text: str, password: str, now_ms: int
) -> dict[str, Any]:
    x = settings.xiaozhi
    return {
        "mqtt": {
            "endpoint": mqtt_endpoint(settings),
            "client_id": f"GID_{board}@@@{dev}@@@{uuid_text}",
            "username": dev,
            "password": password,
            "publish_topic": build_xiaozhi_topic(x.uplink_topic, dev),
            "subscribe_topic": build_xiaozhi_topic(x.downlink_topic, dev),
            "keepalive": x.ota_keepalive_s,
        },
        "server_time": {
            "timestamp": now_ms,
            "timezone_offset": (time.localtime().tm_gmtoff or 0) // 60,
        },
        "firmware": {"version": x.firmware_version, "url": ""},
    }


class OtaEndpoint:
    def __init__(
        self, *, settings: Settings, provision: Provisioner | None, stats: ChannelStats
    ) -> None:
        self._settings = settings
        self._provision = provision
        self._stats = stats

    def attach(self, http: HttpServer) -> None:
        for path in OTA_PATHS:
            http.add_route("POST", path, self.handle)
            http.add_route("GET", path, self.handle)

    async def handle(self, request: web.Request) -> web.Response:
        try:
            dev = device_id_from_mac(request.headers.get("Device-Id"))
            uuid_text = client_uuid(request.headers.get("Client-Id"))
            check_body(await request.read(), dev)
        except OtaRefused as exc:
            return self._reply(400, {"error": str(exc)})
        if self._provision is None:
            return self._reply(503, {"error": "device provisioning is not configured"})
        try:
            creds = await asyncio.to_thread(self._provision, dev)
        except Exception:
            log.exception("provisioning %s failed", dev)
            return self._reply(500, {"error": "provisioning failed"})
        if creds.password is None or creds.username != dev:
            log.error("provisioner returned unusable credentials for %s", dev)
            return self._reply(500, {"error": "provisioning failed"})
        body = ota_response(
            settings=self._settings,
            dev=dev,
            board=board_name(request.headers.get("User-Agent")),
            uuid_text=uuid_text,
            password=creds.password,
            now_ms=time.time_ns() // 1_000_000,
        )
        log.info("OTA provisioned %s (%s)", dev, request.headers.get("User-Agent", "-")[:60])
        return self._reply(200, body)

    def _reply(self, status: int, body: dict[str, Any]) -> web.Response:
        self._stats.ota_requests.labels(str(status)).inc()
        return web.json_response(body, status=status)


def _safe_dev(mac: str) -> str | None:
    try:
        return device_id_from_mac(mac)
    except OtaRefused:
        return None
