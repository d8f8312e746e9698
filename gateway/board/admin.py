"""A board's status on the admin listener (bearer token when ``http.admin_token`` is set).

* ``GET /admin/boards/{dev}/status`` — what the board channel last learnt of an snlp board: its
  presence and its last heartbeat's figures (``fw``, ``rssi``, ``heap``, ``sd_free_mb``,
  ``up_ms``) and how long ago it came; 404 for a board not tracked (never heard since the
  gateway started, or forgotten to make room: the channel keeps ``board.max_devices`` at most).

A Xiaozhi device's hello features and MCP tool list are at ``GET /admin/devices/{dev}/status``
(:mod:`gateway.xiaozhi.status_admin`).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from gateway.http import RouteTable
from gateway.openapi import RouteDoc
from topics.tree import DEVICE_ID_RE


class BoardStatusView(BaseModel):
    """A tracked board: presence and its last heartbeat (figures absent: not reported)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device: str
    online: bool
    fw: str | None = None
    rssi: int | None = None
    heap: int | None = None
    sd_free_mb: float | None = None
    up_ms: int | None = None
    heartbeat_age_s: float | None = None  # seconds since the last heartbeat; None: none yet


_DOC = RouteDoc(
    summary="What the gateway last learnt of a board: presence, fw, rssi, heap, SD free space",
    tag="devices",
    response=BoardStatusView,
    errors=(400, 404),
)


class BoardStatusAdmin:
    def __init__(
        self, status_of: Callable[[str], BoardStatusView | None], *, admin: RouteTable
    ) -> None:
        self._status_of = status_of
        admin.add_route("GET", "/admin/boards/{dev}/status", self.status, _DOC)

    async def status(self, request: web.Request) -> web.Response:
        dev = request.match_info["dev"]
        if not DEVICE_ID_RE.fullmatch(dev):
            return _error(400, "bad_request", "device id: aa_bb_cc_dd_ee_ff")
        view = self._status_of(dev)
        if view is None:
            return _error(404, "not_found", "board not heard since the gateway started")
        return web.json_response(view.model_dump())


def _error(status: int, error: str, detail: str) -> web.Response:
    return web.json_response({"error": error, "detail": detail}, status=status)
