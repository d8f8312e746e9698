"""SPEAK's view of the Xiaozhi channel: a device's open session, the downlink audio its hello
reply announced (rate, frame duration), and whether its UDP address is known yet."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from gateway.xiaozhi.channel import XiaozhiChannel
from gateway.xiaozhi.live import LiveSession


@dataclass(frozen=True, slots=True)
class DownlinkTarget:
    """Where downlink speech goes: the open session and its decoder's announced parameters."""

    session_id: str
    sample_rate: int
    frame_ms: int


class XiaozhiDownlink:
    """The channel as SPEAK uses it (``SpeechChannel``)."""

    def __init__(self, channel: XiaozhiChannel) -> None:
        self._channel = channel

    def _live(self, dev: str) -> LiveSession | None:
        session = self._channel.core.by_dev(dev)
        return self._channel.route(session.ssrc) if session is not None else None

    def downlink_target(self, dev: str) -> DownlinkTarget | None:
        """``dev``'s open session (None: none) and its downlink audio parameters."""
        live = self._live(dev)
        if live is None:
            return None
        return DownlinkTarget(live.session_id, live.downlink_rate, live.downlink_frame_ms)

    async def reachable(self, dev: str, session_id: str, timeout_s: float) -> bool:
        """Until ``dev``'s session ``session_id`` has sent a datagram (its address is known and
        downlink audio can reach it), at most ``timeout_s``; False if not, or if that session
        is not the open one."""
        live = self._live(dev)
        if live is None or live.session_id != session_id:
            return False
        try:
            async with asyncio.timeout(timeout_s):
                await live.wait_address()
        except TimeoutError:
            return False
        return True

    def publish(self, dev: str, payload: bytes) -> None:
        self._channel.publish(dev, payload)

    def send_audio(self, dev: str, session_id: str, opus_packet: bytes) -> bool:
        return self._channel.send_audio(dev, session_id, opus_packet)
