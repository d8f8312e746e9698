"""The upstream side of one device's CHAT: at most one :class:`UpstreamLink` at a time, opened
per device voice session, plus the gateway-wide retry back-off.

Back-off: after a failed link (connect refused, hello timeout, abnormal close) the next hello
within the back-off gets an immediate goodbye instead of another attempt; the delay doubles per
consecutive failure up to the cap and resets on the first link that completes its hello.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gateway.backoff import BackoffPolicy
from gateway.chat.credentials import UpstreamIdentity
from gateway.chat.framing import AudioFrame
from gateway.chat.upstream import (
    DeviceHelloInfo,
    ServerHelloInfo,
    UpstreamConfig,
    UpstreamError,
    UpstreamLink,
)

log = logging.getLogger(__name__)

Spawn = Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]


@dataclass(slots=True)
class Backoff:
    """The gateway-wide gate in front of new upstream links: closed until ``not_before``
    after a failure; the delay is :class:`~gateway.backoff.BackoffPolicy` (no jitter)."""

    min_s: float
    max_s: float
    failures: int = 0
    not_before: float = 0.0
    policy: BackoffPolicy = field(init=False)

    def __post_init__(self) -> None:
        self.policy = BackoffPolicy(self.min_s, self.max_s)

    def allowed(self, now: float) -> bool:
        return now >= self.not_before

    def failed(self, now: float) -> float:
        self.failures += 1
        delay = self.policy.delay(self.failures)
        self.not_before = now + delay
        return delay

    def succeeded(self) -> None:
        self.failures = 0
        self.not_before = 0.0


# Link failures of one device, not of the server (it flooded its own link; its credentials were
# refused or cannot be made): the back-off every device shares is for the server failing, or
# one device could keep all the others out of chat.
_DEVICE_CAUSED = frozenset(
    {"control_overflow", "auth_refused", "no_client_id", "no_token", "no_auth_key"}
)


@dataclass(frozen=True)
class BridgeContext:
    """What every device's bridge shares (built once by the component)."""

    config: UpstreamConfig
    http: aiohttp.ClientSession
    identify: Callable[[str], UpstreamIdentity]  # blocking (reads files): run off the loop
    backoff: Backoff
    clock: Callable[[], float]
    spawn: Spawn
    count_drop: Callable[[str], None]


class UpstreamBridge:
    """One device's upstream: ``on_end(None)`` when the server ended the session normally,
    ``on_end(error)`` when the link failed; never called for a link closed by :meth:`close`."""

    def __init__(
        self,
        *,
        ctx: BridgeContext,
        dev: str,
        on_json: Callable[[dict[str, Any]], None],
        on_audio: Callable[[bytes], None],
        on_end: Callable[[UpstreamError | None], None],
        on_ready: Callable[[ServerHelloInfo], None] = lambda hello: None,
    ) -> None:
        self._ctx = ctx
        self._dev = dev
        self._on_json = on_json
        self._on_audio = on_audio
        self._on_end = on_end
        self._on_ready = on_ready
        self._link: UpstreamLink | None = None

    @property
    def connected(self) -> bool:
        return self._link is not None and self._link.session_id is not None

    def open(self, hello: DeviceHelloInfo) -> bool:
        """Open a link for a new device session (``hello``: what the device said in its own);
        False while the back-off holds."""
        self.close()
        ctx = self._ctx
        if not ctx.backoff.allowed(ctx.clock()):
            return False
        link = UpstreamLink(
            config=ctx.config,
            http=ctx.http,
            identify=lambda: asyncio.to_thread(ctx.identify, self._dev),
            hello=hello,
            on_json=lambda body: self._from(link, self._on_json, body),
            on_audio=lambda frame: self._from(link, self._audio, frame),
            on_ready=lambda server: self._ready(link, server),
            count_drop=ctx.count_drop,
        )
        self._link = link
        ctx.spawn(self._run(link), f"device[{self._dev}].chat.upstream")
        return True

    def close(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.close()

    def relay(self, message: Mapping[str, Any]) -> None:
        """Device control up (its ``session_id`` is replaced by the upstream's)."""
        if self._link is not None:
            self._link.send_json({k: v for k, v in message.items() if k != "session_id"})

    def forward(self, opus: bytes) -> None:
        if self._link is not None:
            self._link.send_audio(opus)

    def _ready(self, link: UpstreamLink, server: ServerHelloInfo) -> None:
        self._ctx.backoff.succeeded()
        self._from(link, self._on_ready, server)

    def _audio(self, frame: AudioFrame) -> None:
        self._on_audio(frame.opus)

    def _from(self, link: UpstreamLink, deliver: Callable[[Any], None], item: Any) -> None:
        if link is self._link:  # a closed link's late messages go nowhere
            deliver(item)

    async def _run(self, link: UpstreamLink) -> None:
        try:
            await link.run()
        except UpstreamError as exc:
            if exc.reason in _DEVICE_CAUSED:  # not the server's health: back off this link only
                log.warning("chat upstream for %s failed: %s", self._dev, exc)
            else:
                delay = self._ctx.backoff.failed(self._ctx.clock())
                log.warning(
                    "chat upstream for %s failed: %s (retry after %.1fs)", self._dev, exc, delay
                )
            if link is self._link:
                self._link = None
                self._on_end(exc)
            return
        if link is self._link:
            self._link = None
            self._on_end(None)
