"""The gateway asks a device for its MCP tools at connect when nobody else will.

A bridged xiaozhi server asks every device it talks to (v0.9.6: ``initialize``, then
``tools/list``) and the answer is kept on its way (:mod:`status`). A device whose session no
server holds (the embedded engine, a lesson, no upstream) is asked by the gateway itself, once
its hello reply went out, if its hello says it speaks MCP and its tool list is not known yet.

Bounded: at most ``QUEUE`` devices wait to be asked (more are dropped, counted) and ``AT_ONCE``
requests are out at a time; a device that does not answer within ``TIMEOUT_S`` is counted by
the MCP client and asked again at its next connect. One device's silence delays no other's
beyond its slot.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gateway.xiaozhi.mcp import McpClient, McpError, McpTimeout

log = logging.getLogger(__name__)

QUEUE = 256
AT_ONCE = 8
TIMEOUT_S = 5.0


class ToolsAsker:
    def __init__(self, *, mcp: McpClient, dropped: Callable[[], None]) -> None:
        self._mcp = mcp
        self._dropped = dropped
        self._queue: asyncio.Queue[str] = asyncio.Queue(QUEUE)
        self._waiting: set[str] = set()  # queued or being asked: asked once at a time

    def want(self, dev: str) -> None:
        """Ask ``dev`` for its tools soon (no-op while it is already waiting or being asked)."""
        if dev in self._waiting:
            return
        try:
            self._queue.put_nowait(dev)
        except asyncio.QueueFull:
            self._dropped()
            return
        self._waiting.add(dev)

    async def run(self) -> None:
        slots = asyncio.Semaphore(AT_ONCE)
        async with asyncio.TaskGroup() as tg:
            while True:
                dev = await self._queue.get()
                await slots.acquire()
                tg.create_task(self._ask(dev, slots), name=f"xiaozhi[{dev}].tools")

    async def _ask(self, dev: str, slots: asyncio.Semaphore) -> None:
        try:
            await self._mcp.request(dev, "tools/list", timeout_s=TIMEOUT_S)  # kept by status
        except (McpError, McpTimeout) as exc:
            log.info("%s", exc)
        except Exception:
            log.exception("asking %s for its MCP tools failed", dev)
        finally:
            self._waiting.discard(dev)
            slots.release()
