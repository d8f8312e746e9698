"""Device approval on the admin listener (bearer token when ``http.admin_token`` is set).

* ``GET  /admin/devices`` — bound devices: ``{dev: {client_id, generation, serial}}``.
* ``GET  /admin/devices/pending`` — activation codes waiting: device, Client-Id, seconds left.
* ``POST /admin/devices/approve`` ``{"code": "123456"}`` — binds the code's device to the
  Client-Id that asked; its next OTA request gets credentials (a new password generation).
  404 for an unknown or expired code, 429 while too many wrong codes were tried lately.
* ``POST /admin/devices/{dev}/rotate`` — next password generation for a bound device (its
  next OTA request fetches it; the old password stops working then).
* ``DELETE /admin/devices/{dev}`` — unbind the device and delete its broker user (the broker
  drops its connection on reload); its next OTA request is a first contact again. Its status
  (``GET /admin/devices/{dev}/status``, :mod:`gateway.xiaozhi.status_admin`) is forgotten too.

``snlpgw device approve CODE`` (and ``pending``, ``list``, ``rotate``) calls these routes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, Field

from gateway.http import RouteTable
from gateway.openapi import RouteDoc
from gateway.settings import Settings
from gateway.xiaozhi.ota.endpoint import OtaEndpoint
from gateway.xiaozhi.ota.provisioning import Provisioner, broker_provisioner, broker_revoker
from gateway.xiaozhi.ota.trust import Approval
from gateway.xiaozhi.stats import ChannelStats
from gateway.xiaozhi.status import StatusBook
from gateway.xiaozhi.status_admin import StatusAdmin
from topics.errors import PayloadError
from topics.wire import load_json

log = logging.getLogger(__name__)


class ApproveRequest(BaseModel):
    """The activation code a device shows (6 digits)."""

    code: str = Field(pattern=r"^[0-9]{6}$")


_DOCS = {
    "devices": RouteDoc(
        summary="Bound Xiaozhi devices: Client-Id, password generation, serial", tag="devices"
    ),
    "pending": RouteDoc(
        summary="Activation codes waiting for approval, with seconds left", tag="devices"
    ),
    "approve": RouteDoc(
        summary="Approve an activation code: its device gets credentials at its next OTA request",
        tag="devices",
        body=ApproveRequest,
        errors=(400, 404, 429, 503),
    ),
    "rotate": RouteDoc(
        summary="Next password generation for a bound device", tag="devices", errors=(400, 404, 503)
    ),
    "forget": RouteDoc(
        summary="Unbind a device and delete its broker user", tag="devices", errors=(400, 404, 503)
    ),
}

_CODE_RE = re.compile(r"[0-9]{6}")
_DEV_RE = re.compile(r"[0-9a-f]{2}(_[0-9a-f]{2}){5}")
_APPROVE_STATUS = {Approval.APPROVED: 200, Approval.UNKNOWN: 404, Approval.LOCKED: 429}


def serve_ota(
    settings: Settings,
    provision: Provisioner | None,
    status: StatusBook | None = None,
    *,
    stats: ChannelStats,
    http: RouteTable,
    admin: RouteTable | None,
) -> OtaEndpoint:
    """The OTA endpoint on ``http`` and its approvals on ``admin`` (if any), provisioning
    through the broker files under ``data_dir`` unless ``provision`` is given; with ``status``,
    the devices' status route too (a device unbound is forgotten there)."""
    ota = OtaEndpoint(
        settings=settings,
        provision=provision or broker_provisioner(settings),
        revoke=broker_revoker(data_dir=settings.data_dir),
        stats=stats,
        http=http,
    )
    if admin is not None:
        OtaAdmin(ota, admin=admin, forgotten=status.forget if status else lambda _dev: None)
        if status is not None:
            StatusAdmin(status, admin=admin)
    return ota


class OtaAdmin:
    def __init__(
        self,
        ota: OtaEndpoint,
        *,
        admin: RouteTable,
        forgotten: Callable[[str], object] = lambda _dev: None,
    ) -> None:
        """Serves the approval routes on ``admin`` (added here)."""
        self._ota = ota
        self._forgotten = forgotten
        admin.add_route("GET", "/admin/devices", self.devices, _DOCS["devices"])
        admin.add_route("GET", "/admin/devices/pending", self.pending, _DOCS["pending"])
        admin.add_route("POST", "/admin/devices/approve", self.approve, _DOCS["approve"])
        admin.add_route("POST", "/admin/devices/{dev}/rotate", self.rotate, _DOCS["rotate"])
        admin.add_route("DELETE", "/admin/devices/{dev}", self.forget, _DOCS["forget"])

    async def devices(self, _: web.Request) -> web.Response:
        out = {
            dev: {"client_id": b.client_id, "generation": b.generation, "serial": b.serial}
            for dev, b in sorted(self._ota.book.bindings.items())
        }
        return web.json_response({"devices": out})

    async def pending(self, _: web.Request) -> web.Response:
        now = self._ota.clock()
        out = [
            {
                "code": p.code,
                "device": p.dev,
                "client_id": p.client_id,
                "serial": p.serial,
                "expires_in_s": round(p.expires - now, 1),
            }
            for p in self._ota.book.pending(now)
        ]
        return web.json_response({"pending": out})

    async def approve(self, request: web.Request) -> web.Response:
        try:
            body: Any = load_json(await request.read() or b"{}", max_bytes=None)
        except PayloadError as exc:  # malformed, nested too deep, a lone surrogate: all 400
            return _error(400, "bad_request", f'expected {{"code": "<6 digits>"}} ({exc})')
        code = body.get("code") if isinstance(body, dict) else None
        if not isinstance(code, str) or not _CODE_RE.fullmatch(code):
            return _error(400, "bad_request", 'expected {"code": "<6 digits>"}')
        outcome, pending = self._ota.book.approve(code, self._ota.clock())
        self._ota.stats.approvals.labels(outcome.value).inc()
        if pending is None:
            detail = "too many wrong codes; wait a minute" if outcome is Approval.LOCKED else ""
            return _error(_APPROVE_STATUS[outcome], outcome.value, detail or "no such code")
        if not await self._persisted():
            return _error(503, "unavailable", "approved, but the binding could not be saved yet")
        log.info("OTA: %s approved for a new Client-Id", pending.dev)
        return web.json_response(
            {"status": outcome.value, "device": pending.dev, "client_id": pending.client_id}
        )

    async def rotate(self, request: web.Request) -> web.Response:
        dev = request.match_info["dev"]
        if not _DEV_RE.fullmatch(dev):
            return _error(400, "bad_request", "device id: aa_bb_cc_dd_ee_ff")
        binding = self._ota.book.rotate(dev)
        if binding is None:
            return _error(404, "not_found", "device not bound")
        if not await self._persisted():
            return _error(503, "unavailable", "rotated, but the binding could not be saved yet")
        return web.json_response({"device": dev, "generation": binding.generation})

    async def forget(self, request: web.Request) -> web.Response:
        dev = request.match_info["dev"]
        if not _DEV_RE.fullmatch(dev):
            return _error(400, "bad_request", "device id: aa_bb_cc_dd_ee_ff")
        try:
            found = await self._ota.forget(dev)
        except Exception:
            log.exception("forgetting %s failed", dev)
            return _error(503, "unavailable", "unbound, but the files could not be updated")
        self._forgotten(dev)
        if not found:
            return _error(404, "not_found", "device not bound")
        log.info("OTA: %s unbound and its broker user deleted", dev)
        return web.json_response({"device": dev, "forgotten": True})

    async def _persisted(self) -> bool:
        """Save the bindings now; on failure the next OTA or admin change saves them."""
        try:
            await self._ota.persist()
        except Exception:
            log.exception("saving OTA bindings failed")
            return False
        return True


def _error(status: int, error: str, detail: str) -> web.Response:
    return web.json_response({"error": error, "detail": detail}, status=status)
