"""The gateway's own ``tools/list`` at connect: one request per device at a time, bounded."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.xiaozhi import tools
from gateway.xiaozhi.mcp import McpClient
from gateway.xiaozhi.tools import ToolsAsker


class Devices:
    """The MCP client's publish side: records each request, answers on demand."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, object]]] = []
        self.sent = asyncio.Event()

    def publish(self, dev: str, payload: bytes) -> None:
        self.requests.append((dev, json.loads(payload)["payload"]))
        self.sent.set()

    async def wait(self, n: int) -> None:
        async with asyncio.timeout(5):
            while len(self.requests) < n:
                self.sent.clear()
                await self.sent.wait()


def rig() -> tuple[ToolsAsker, McpClient, Devices, list[str]]:
    devices, counted, dropped = Devices(), [], []
    mcp = McpClient(publish=devices.publish, session_id_of=lambda d: "s", count=counted.append)
    return ToolsAsker(mcp=mcp, dropped=lambda: dropped.append("x")), mcp, devices, dropped


async def test_a_device_is_asked_once_at_a_time_and_again_after_its_answer() -> None:
    asker, mcp, devices, _ = rig()
    task = asyncio.create_task(asker.run())
    asker.want("aa")
    asker.want("aa")  # already waiting: no second request
    await devices.wait(1)
    ((dev, request),) = devices.requests
    assert (dev, request["method"]) == ("aa", "tools/list")
    assert mcp.offer("aa", {"jsonrpc": "2.0", "id": request["id"], "result": {"tools": []}})
    for _ in range(5):
        await asyncio.sleep(0)
    asker.want("aa")  # answered: may be asked again (its next connect)
    await devices.wait(2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_silent_device_is_given_up_and_a_full_queue_drops_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tools, "TIMEOUT_S", 0.05)
    monkeypatch.setattr(tools, "QUEUE", 2)
    asker, _, devices, dropped = rig()
    for dev in ("a", "b", "c"):
        asker.want(dev)
    assert dropped == ["x"]  # the queue holds two
    task = asyncio.create_task(asker.run())
    await devices.wait(2)
    async with asyncio.timeout(5):
        while asker._waiting:  # noqa: ASYNC110 - both time out unanswered and are let go
            await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
