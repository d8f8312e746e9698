"""One open session as the shell holds it: the core :class:`Session` plus its crypto state
(codec's receiver/sender), source binding, datagram budget and audio pipeline, and the
factory that assembles them on ``hello``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from codec.opus import OpusStreamDecoder
from codec.udp import DownlinkSender, UplinkReceiver
from gateway.xiaozhi.binding import AddressBinding
from gateway.xiaozhi.pipeline import AudioPipeline
from gateway.xiaozhi.ratelimit import TokenBucket
from gateway.xiaozhi.sessions import Session
from gateway.xiaozhi.voice_ports import PipelineCounters, Segmenter, VoiceSink


@dataclass(eq=False)
class LiveSession:
    """Shell state of one open session: crypto, binding, pipeline, the device's address."""

    session: Session
    receiver: UplinkReceiver
    sender: DownlinkSender
    binding: AddressBinding
    pipeline: AudioPipeline
    bucket: TokenBucket
    rebind_bucket: TokenBucket  # REBIND candidates only: they never spend ``bucket``
    address_known: bool = False  # an authentic uplink datagram came: downlink has a target
    replied: bool = False  # its hello reply went out (held while a bridged server answers)
    # What its hello reply told the device's decoder (downlink Opus rate and frame duration).
    downlink_rate: int = 16_000
    downlink_frame_ms: int = 60
    # Made only when used (most sessions never speak a lesson's TTS): no Event or Lock per open
    # session for the garbage collector to walk.
    _address_event: asyncio.Event | None = field(default=None, repr=False)
    _speaking: asyncio.Lock | None = field(default=None, repr=False)

    def address_seen(self) -> None:
        self.address_known = True
        if self._address_event is not None:
            self._address_event.set()

    async def wait_address(self) -> None:
        """Until :meth:`address_seen` (at once if it was)."""
        if self.address_known:
            return
        if self._address_event is None:
            self._address_event = asyncio.Event()
        await self._address_event.wait()

    @property
    def speaking(self) -> asyncio.Lock:
        """One utterance at a time per session (made at the first one)."""
        if self._speaking is None:
            self._speaking = asyncio.Lock()
        return self._speaking

    @property
    def dev(self) -> str:
        return self.session.dev

    @property
    def session_id(self) -> str:
        return self.session.session_id


# Datagrams per second from a new source address that may be decrypted and checked as a NAT
# rebinding of a session whose source went silent (a real device needs one).
REBIND_TRIES_PER_S = 4.0


@dataclass(frozen=True)
class LiveFactory:
    """Builds the shell state of a fresh session (new decoder, segmenter factory, budget)."""

    voice: VoiceSink | None
    new_segmenter: Callable[[], Segmenter]
    counters: PipelineCounters
    queue_frames: int
    rebind_after_s: float
    rate_pps: float
    burst: int
    notify: Callable[[AudioPipeline], None] | None = None  # the channel's AudioPump
    packets_kept: int = 0  # Opus packets kept per session for the archive (0: none)

    def __call__(self, session: Session, *, listening: bool) -> LiveSession:
        pipeline = AudioPipeline(
            dev=session.dev,
            session_id=session.session_id,
            sink=self.voice or NullVoice(),
            decoder=OpusStreamDecoder(),
            new_segmenter=self.new_segmenter,
            counters=self.counters,
            capacity=self.queue_frames,
            listening=listening,
            notify=self.notify,
            packets_kept=self.packets_kept,
        )
        return LiveSession(
            session=session,
            receiver=UplinkReceiver(key=session.key, ssrc=session.ssrc),
            sender=DownlinkSender(key=session.key, ssrc=session.ssrc),
            binding=AddressBinding(self.rebind_after_s),
            pipeline=pipeline,
            bucket=TokenBucket(rate=self.rate_pps, burst=self.burst),
            rebind_bucket=TokenBucket(rate=REBIND_TRIES_PER_S, burst=REBIND_TRIES_PER_S),
        )


class NullVoice:
    """A voice sink that drops every utterance (no task runtime behind the channel)."""

    def speech_started(self, dev: str, session_id: str, at_ms: float) -> None:
        return None

    def speech_stopped(
        self,
        dev: str,
        session_id: str,
        pcm: bytes,
        start_ms: float,
        end_ms: float,
        *,
        packets: Sequence[bytes] = (),
    ) -> None:
        return None
