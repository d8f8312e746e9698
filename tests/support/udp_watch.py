"""Wake a test whenever the gateway's real UDP endpoint has handled datagrams.

UDP gives a sender no acknowledgement, so a test that fires datagrams at the gateway needs
another way to know they were processed before it reads counters. This wraps the channel's
endpoint's ``datagram_received`` (:attr:`XiaozhiChannel.udp_endpoint`, the protocol its
``run()`` binds; the asyncio transport looks the method up on the protocol instance on every
readiness event, and the endpoint then drains what else is queued): after the original handler
returns, waiters re-check their condition (typically on the channel's metrics). Nothing about
the handling changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.xiaozhi.channel import XiaozhiChannel

WAIT_S = 30.0


class DatagramWatch:
    def __init__(self, channel: XiaozhiChannel) -> None:
        endpoint = channel.udp_endpoint
        self._changed = asyncio.Event()
        original = endpoint.datagram_received

        def observed(data: bytes, addr: tuple[str | int, ...]) -> None:
            try:
                original(data, addr)
            finally:
                self._changed.set()

        endpoint.datagram_received = observed  # type: ignore[method-assign]

    async def until(self, condition: Callable[[], bool], wait_s: float = WAIT_S) -> None:
        """Return once ``condition()`` holds (checked after every handled datagram)."""
        async with asyncio.timeout(wait_s):
            while not condition():
                self._changed.clear()
                await self._changed.wait()
