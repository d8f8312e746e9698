"""MCP (JSON-RPC 2.0) requests from the gateway to a device, and the replies that answer them.

The device is the MCP server (reference §6.3): request ids must be JSON numbers, errors come
back without ``code``. Ids come from one counter per gateway, so a reply is matched by
``(device, id)``: a device can only answer requests that were sent to it.

Id space: a bridged xiaozhi server talks MCP to the same device through CHAT, with its own
ids (v0.9.6: ``initialize`` 1, ``tools/list`` 2, ``tools/call`` from a counter at 1). The
gateway's ids start at ``GATEWAY_IDS`` (2**30) and wrap inside [2**30, 2**31) (the firmware
reads ids with cJSON's ``valueint``, an int32), so the device's answer to the server is never
taken for the gateway's while the server's ids stay below 2**30.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping
from typing import Any

from gateway.xiaozhi import messages

GATEWAY_IDS = 1 << 30
_ID_SPAN = 1 << 30


class McpError(Exception):
    """The device answered with a JSON-RPC error object."""

    def __init__(self, dev: str, method: str, error: Mapping[str, Any]) -> None:
        self.dev = dev
        self.method = method
        self.error = dict(error)
        super().__init__(f"{dev}: MCP {method} failed: {error.get('message', error)!r}")


class McpTimeout(TimeoutError):
    def __init__(self, dev: str, method: str, timeout_s: float) -> None:
        self.dev = dev
        self.method = method
        super().__init__(f"{dev}: no MCP reply to {method} within {timeout_s:.1f}s")


class McpClient:
    def __init__(
        self,
        *,
        publish: Callable[[str, bytes], None],
        session_id_of: Callable[[str], str],
        count: Callable[[str], None],
        first_id: int = GATEWAY_IDS,
    ) -> None:
        self._publish = publish
        self._session_id_of = session_id_of
        self._count = count
        self._ids = (GATEWAY_IDS + n % _ID_SPAN for n in itertools.count(first_id - GATEWAY_IDS))
        self._pending: dict[tuple[str, int], asyncio.Future[dict[str, Any]]] = {}

    async def request(
        self,
        dev: str,
        method: str,
        params: Mapping[str, Any] | None = None,
        *,
        timeout_s: float = 10.0,
    ) -> dict[str, Any]:
        """Send ``method`` to ``dev`` and return its ``result``; raises McpError / McpTimeout."""
        rid = next(self._ids)
        payload: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            payload["params"] = dict(params)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[(dev, rid)] = future
        try:
            self._publish(dev, messages.mcp(self._session_id_of(dev), payload))
            async with asyncio.timeout(timeout_s):
                reply = await future
        except TimeoutError:
            self._count("timeout")
            raise McpTimeout(dev, method, timeout_s) from None
        finally:
            self._pending.pop((dev, rid), None)
        if "error" in reply:
            self._count("error")
            error = reply["error"]
            raise McpError(dev, method, error if isinstance(error, dict) else {"message": error})
        self._count("ok")
        result = reply.get("result")
        return result if isinstance(result, dict) else {"value": result}

    def notify(self, dev: str, method: str, params: Mapping[str, Any] | None = None) -> None:
        """A JSON-RPC notification (no ``id``, no reply; the device ignores ``notifications/*``
        methods' results by design)."""
        payload: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            payload["params"] = dict(params)
        self._publish(dev, messages.mcp(self._session_id_of(dev), payload))

    def offer(self, dev: str, payload: Mapping[str, Any]) -> bool:
        """Consume ``payload`` if it answers one of our pending requests to ``dev``."""
        rid = payload.get("id")
        if isinstance(rid, bool) or not isinstance(rid, int) or "method" in payload:
            return False
        future = self._pending.get((dev, rid))
        if future is None or future.done():
            return False
        future.set_result(dict(payload))
        return True

    @property
    def pending(self) -> int:
        return len(self._pending)
