"""The gateway's MCP request ids live apart from a bridged xiaozhi server's (v0.9.6 uses 1, 2
and a counter from 1): a device's answer to the server is never taken for the gateway's."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gateway.xiaozhi.mcp import GATEWAY_IDS, McpClient


async def test_gateway_ids_start_at_2_30_wrap_below_2_31_and_server_ids_pass() -> None:
    sent: list[dict[str, Any]] = []
    client = McpClient(
        publish=lambda dev, payload: sent.append(json.loads(payload)),
        session_id_of=lambda dev: "s",
        count=lambda outcome: None,
        first_id=(1 << 31) - 1,  # the last id of the range: the next one wraps
    )
    requests = [
        asyncio.create_task(client.request("d", "tools/list", timeout_s=5)) for _ in range(2)
    ]
    await asyncio.sleep(0)
    ids = [m["payload"]["id"] for m in sent]
    assert ids == [(1 << 31) - 1, GATEWAY_IDS]
    # the device answers the server's tools/list (id 2) and initialize (id 1): not ours
    assert not client.offer("d", {"jsonrpc": "2.0", "id": 2, "result": {"tools": []}})
    assert not client.offer("d", {"jsonrpc": "2.0", "id": 1, "result": {}})
    for rid in ids:
        assert client.offer("d", {"jsonrpc": "2.0", "id": rid, "result": {"tools": []}})
    assert [await r for r in requests] == [{"tools": []}, {"tools": []}]
    assert McpClient(publish=lambda d, p: None, session_id_of=str, count=print).pending == 0
