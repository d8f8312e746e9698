"""Speaking to a device: ``tts start`` over MQTT, paced Opus over UDP, ``tts stop``.

The pacing rules are :mod:`downlink`'s; this module adds the session rules around them: the
device's address must be known (it has sent a datagram), one utterance at a time per
session, and a session that closes while speaking ends the utterance (:class:`NoSession`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from gateway.xiaozhi import messages
from gateway.xiaozhi.downlink import Pacing, SpeakInterrupted, SpeakResult, send_paced
from gateway.xiaozhi.live import LiveSession


class NoSession(LookupError):
    def __init__(self, dev: str, detail: str = "no open Xiaozhi session") -> None:
        self.dev = dev
        super().__init__(f"{dev}: {detail}")


class SessionSpeaker:
    def __init__(
        self,
        *,
        publish: Callable[[str, bytes], None],  # dev, control message
        send: Callable[[LiveSession, bytes], bool],  # one sealed datagram to the session
        is_current: Callable[[LiveSession], bool],  # the session is still open
        clock: Callable[[], float],
        address_wait_s: float,
        tts_lead_s: float,
        pacing: Pacing | None = None,
    ) -> None:
        self._publish = publish
        self._send = send
        self._is_current = is_current
        self._clock = clock
        self._address_wait_s = address_wait_s
        # `tts start` travels through the broker, audio straight over UDP, and devices discard
        # audio that arrives before `tts start` (reference §6.2): give the control a head start.
        self._tts_lead_s = tts_lead_s
        self._pacing = pacing or Pacing()

    async def speak(self, live: LiveSession, opus_packets: Iterable[bytes]) -> SpeakResult:
        dev = live.dev
        try:
            async with asyncio.timeout(self._address_wait_s):
                await live.wait_address()
        except TimeoutError:
            raise NoSession(dev, "device address unknown (no uplink datagram yet)") from None
        send, is_current = self._send, self._is_current
        async with live.speaking:  # one utterance at a time per session
            self._publish(dev, messages.tts(live.session_id, "start"))
            if self._tts_lead_s > 0:
                await asyncio.sleep(self._tts_lead_s)
            try:
                result = await send_paced(
                    opus_packets,
                    pacing=self._pacing,
                    clock=self._clock,
                    send=lambda packet: send(live, packet),
                    still_open=lambda: is_current(live),
                )
            except SpeakInterrupted:
                raise NoSession(dev, "session closed while speaking") from None
            if is_current(live):
                self._publish(dev, messages.tts(live.session_id, "stop"))
            return result
