"""A Xiaozhi device's status on the admin listener (bearer token when ``http.admin_token`` is set).

* ``GET /admin/devices/{dev}/status`` — what the gateway last learnt of the device
  (:mod:`status`): ``{"device", "features", "hello_at", "mcp": {"tools", "seen_at", "complete",
  "cut", "bytes"}}``, times in epoch seconds; 404 for a device not heard since the gateway
  started (or forgotten: unbound, or evicted by newer devices).
"""

from __future__ import annotations

from aiohttp import web

from gateway.http import RouteTable
from gateway.openapi import RouteDoc
from gateway.xiaozhi.status import StatusBook
from topics.tree import DEVICE_ID_RE

_DOC = RouteDoc(
    summary="What the gateway last learnt of a Xiaozhi device: hello features and MCP tools",
    tag="devices",
    errors=(400, 404),
)


class StatusAdmin:
    def __init__(self, book: StatusBook, *, admin: RouteTable) -> None:
        self._book = book
        admin.add_route("GET", "/admin/devices/{dev}/status", self.status, _DOC)

    async def status(self, request: web.Request) -> web.Response:
        dev = request.match_info["dev"]
        if not DEVICE_ID_RE.fullmatch(dev):
            return _error(400, "bad_request", "device id: aa_bb_cc_dd_ee_ff")
        record = self._book.get(dev)
        if record is None:
            return _error(404, "not_found", "device not heard since the gateway started")
        return web.json_response({"device": dev, **record.as_json()})


def _error(status: int, error: str, detail: str) -> web.Response:
    return web.json_response({"error": error, "detail": detail}, status=status)
