"""One WebSocket to an upstream xiaozhi server per device voice session (the job the Node
xiaozhi-mqtt-gateway does; reference §9, §10).

``run()`` resolves who the device is (:mod:`credentials`, off the loop), connects with the
headers the firmware itself sends on a WebSocket (``Device-Id`` = its MAC, ``Client-Id`` = its
UUID, ``Protocol-Version``, ``Authorization`` under the configured scheme; ``?from=mqtt_gateway``
with the gateway framing), says the DEVICE's hello (its own ``features`` and ``audio_params``,
as the Node gateway forwards them), waits for the server's hello (its ``session_id`` and
``audio_params``, handed to ``on_ready``), then pumps: device control and Opus go up through
two bounded queues, server JSON and audio come down through callbacks. Resolving, connecting
and the server's hello share one bound, ``hello_wait_s`` (the device gives up on its own hello
after 10 s). Session ids are the caller's business (it rewrites them both ways); this module
stamps the upstream's id on what it sends.

Refusals, as xiaozhi-esp32-server v0.9.6 (``core/websocket_server.py``) makes them: it accepts
the upgrade, sends the text ``认证失败`` and closes; older servers and proxies answer the upgrade
with HTTP 401/403. Both are ``auth_refused``; any other close before the hello is
``closed_before_hello``.

Queues: uplink audio holds ``audio_capacity`` frames and drops the oldest (counted); control is
never dropped — past ``control_capacity`` pending messages the link fails (the caller says
goodbye to the device and raises an alarm) instead of silently losing a ``listen stop``.

``run()`` returns when the server ended the session normally (close code 1000 or its
``goodbye``) or :meth:`close` was called; any other end raises :class:`UpstreamError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from gateway.chat.auth import AUTH_FAILED_TEXT, AuthUnavailable
from gateway.chat.credentials import UpstreamIdentity
from gateway.chat.framing import AudioFrame, FrameError, Framing, pack, unpack
from topics.errors import PayloadError
from topics.wire import load_json

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 1 << 20
# How long a closing link waits for the server's close reply. Short: at gateway shutdown every
# bridged session closes at once and the service's stop budget is a few seconds.
CLOSE_WAIT_S = 0.5


class UpstreamError(Exception):
    """The upstream failed; ``reason`` is a metric/alarm label, ``detail`` for logs."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail[:200]
        super().__init__(f"{reason}: {self.detail}" if detail else reason)


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    url: str
    framing: Framing = Framing.GATEWAY
    hello_wait_s: float = 5.0  # resolve + connect + the server's hello (the device waits 10 s)
    audio_capacity: int = 50
    control_capacity: int = 64
    heartbeat_s: float = 20.0

    def request_url(self) -> str:
        if self.framing is not Framing.GATEWAY:
            return self.url
        parts = urlsplit(self.url)
        query = "&".join(q for q in (parts.query, "from=mqtt_gateway") if q)
        return urlunsplit(parts._replace(query=query))

    def headers(self, identity: UpstreamIdentity) -> dict[str, str]:
        """The firmware's WebSocket headers (``websocket_protocol.cc``), in its order."""
        headers: dict[str, str] = {}
        if identity.authorization:
            headers["Authorization"] = identity.authorization
        headers["Protocol-Version"] = str(self.framing.protocol_version)
        headers["Device-Id"] = identity.device_id
        if identity.client_id:
            headers["Client-Id"] = identity.client_id
        return headers


@dataclass(frozen=True, slots=True)
class DeviceHelloInfo:
    """What the device said in its own hello, forwarded as it said it."""

    features: dict[str, Any] = field(default_factory=dict)
    audio_params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ServerHelloInfo:
    """The server's hello: its session id and the audio it will send (raw, validated by the
    caller)."""

    session_id: str
    audio_params: dict[str, Any] | None


def upstream_hello(framing: Framing, device: DeviceHelloInfo) -> dict[str, Any]:
    """The hello the gateway sends for the device: the device's own features and audio
    params (the Node gateway's ``{type, version: 2, transport, audio_params, features}``)."""
    hello: dict[str, Any] = {
        "type": "hello",
        "version": framing.protocol_version,
        "transport": "websocket",
    }
    if device.features:
        hello["features"] = dict(device.features)
    hello["audio_params"] = dict(device.audio_params) or {
        "format": "opus",
        "sample_rate": 16000,
        "channels": 1,
        "frame_duration": 60,
    }
    return hello


class UpstreamLink:
    def __init__(
        self,
        *,
        config: UpstreamConfig,
        http: aiohttp.ClientSession,
        identify: Callable[[], Awaitable[UpstreamIdentity]],
        hello: DeviceHelloInfo,
        on_json: Callable[[dict[str, Any]], None],
        on_audio: Callable[[AudioFrame], None],
        on_ready: Callable[[ServerHelloInfo], None] = lambda hello: None,
        count_drop: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self._config = config
        self._http = http
        self._identify = identify
        self._hello = hello
        self._on_json = on_json
        self._on_audio = on_audio
        self._on_ready = on_ready
        self._count_drop = count_drop
        self._audio: deque[bytes] = deque()  # bounded: audio_capacity, drop oldest
        self._control: deque[dict[str, Any]] = deque()  # bounded: control_capacity, then fail
        self._wake = asyncio.Event()
        self._closing = False
        self._overflowed = False
        self._failure: UpstreamError | None = None  # the writer's, reported by the reader
        self.session_id: str | None = None

    # -- sending (sync, from the loop's callbacks) --------------------------------------------

    def send_audio(self, opus: bytes, timestamp: int = 0) -> None:
        self._audio.append(pack(self._config.framing, opus, timestamp))
        if len(self._audio) > self._config.audio_capacity:
            self._audio.popleft()
            self._count_drop("uplink_overflow")
        self._wake.set()

    def send_json(self, message: Mapping[str, Any]) -> None:
        if len(self._control) >= self._config.control_capacity:
            self._overflowed = True
        else:
            self._control.append(dict(message))
        self._wake.set()

    def close(self) -> None:
        """End the link; ``run()`` returns after closing the WebSocket."""
        self._closing = True
        self._wake.set()

    # -- the link --------------------------------------------------------------------------

    async def run(self) -> None:
        config = self._config
        loop = asyncio.get_running_loop()
        deadline = loop.time() + config.hello_wait_s
        try:
            async with asyncio.timeout_at(deadline):
                identity = await self._identify()
                ws = await self._http.ws_connect(
                    config.request_url(),
                    headers=config.headers(identity),
                    heartbeat=config.heartbeat_s,
                    timeout=aiohttp.ClientWSTimeout(ws_close=CLOSE_WAIT_S),
                    max_msg_size=MAX_MESSAGE_BYTES,
                )
        except AuthUnavailable as exc:
            raise UpstreamError(exc.reason) from None
        except TimeoutError:
            raise UpstreamError("connect_timeout", config.url) from None
        except aiohttp.WSServerHandshakeError as exc:
            reason = "auth_refused" if exc.status in (401, 403) else "handshake_refused"
            raise UpstreamError(reason, f"HTTP {exc.status}") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError("connect_failed", str(exc)) from None
        try:
            await self._session(ws, deadline)
        except (aiohttp.ClientError, ConnectionError) as exc:  # e.g. the hello's send
            raise UpstreamError("send_failed", str(exc)) from None
        finally:
            await _close(ws)

    async def _session(self, ws: aiohttp.ClientWebSocketResponse, deadline: float) -> None:
        config = self._config
        hello = upstream_hello(config.framing, self._hello)
        await ws.send_str(json.dumps(hello, ensure_ascii=False, separators=(",", ":")))
        try:
            async with asyncio.timeout_at(deadline):
                server = await self._await_hello(ws)
        except TimeoutError:
            raise UpstreamError("hello_timeout", config.url) from None
        self.session_id = server.session_id
        self._on_ready(server)
        failure: UpstreamError | None = None
        async with asyncio.TaskGroup() as tg:
            writer = tg.create_task(self._write(ws), name="chat.upstream.writer")
            try:
                await self._read(ws)
            except UpstreamError as exc:  # raised below: inside, the group would wrap it
                failure = exc
            finally:
                writer.cancel()
        if failure is not None:
            raise failure

    async def _await_hello(self, ws: aiohttp.ClientWebSocketResponse) -> ServerHelloInfo:
        refused = False
        while True:
            msg = await ws.receive()
            if msg.type is aiohttp.WSMsgType.TEXT:
                body = _json(msg.data)
                if body is not None and body.get("type") == "hello":
                    sid, params = body.get("session_id"), body.get("audio_params")
                    return ServerHelloInfo(
                        sid if isinstance(sid, str) else "",
                        params if isinstance(params, dict) else None,
                    )
                refused = refused or (body is None and msg.data.strip() == AUTH_FAILED_TEXT)
            elif msg.type is aiohttp.WSMsgType.BINARY:
                continue  # audio before the hello: ignored
            elif msg.type is aiohttp.WSMsgType.ERROR:
                raise UpstreamError("error", str(ws.exception()))
            else:  # closed before its hello: the v0.9.6 refusal, or a server that gave up
                if refused:
                    raise UpstreamError("auth_refused", "server said 认证失败")
                raise UpstreamError("closed_before_hello", f"close code {ws.close_code}")

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        while True:
            msg = await ws.receive()
            if self._closing and self._failure is None:
                return
            if msg.type is aiohttp.WSMsgType.TEXT:
                body = _json(msg.data)
                if body is None:
                    self._count_drop("bad_json")
                elif body.get("type") == "goodbye":
                    return  # the server ended the session
                elif body.get("type") != "hello":
                    self._on_json(body)
            elif msg.type is aiohttp.WSMsgType.BINARY:
                try:
                    self._on_audio(unpack(self._config.framing, msg.data))
                except FrameError as exc:
                    self._count_drop(f"bad_frame_{exc.reason}")
            elif self._ended(ws, msg):
                return

    def _ended(self, ws: aiohttp.ClientWebSocketResponse, msg: aiohttp.WSMessage) -> bool:
        """True for a normal close; raises for an abnormal one; False for other frames."""
        if self._failure is not None:
            raise self._failure
        if msg.type in (
            aiohttp.WSMsgType.CLOSE,
            aiohttp.WSMsgType.CLOSING,
            aiohttp.WSMsgType.CLOSED,
        ):
            if self._closing or ws.close_code == aiohttp.WSCloseCode.OK:
                return True
            raise UpstreamError("closed", f"close code {ws.close_code}")
        if msg.type is aiohttp.WSMsgType.ERROR:
            raise UpstreamError("error", str(ws.exception()))
        return False

    async def _write(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        try:
            await self._pump(ws)
        except (aiohttp.ClientError, ConnectionError) as exc:
            self._failure = UpstreamError("send_failed", str(exc))
            await _close(ws, aiohttp.WSCloseCode.INTERNAL_ERROR)

    async def _pump(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._overflowed:
                self._failure = UpstreamError("control_overflow")
                await _close(ws, aiohttp.WSCloseCode.TRY_AGAIN_LATER)
                return
            if self._closing:
                await _close(ws)
                return
            while self._control:
                message = self._control.popleft()
                message["session_id"] = self.session_id
                await ws.send_str(json.dumps(message, ensure_ascii=False, separators=(",", ":")))
            while self._audio and not self._closing:
                await ws.send_bytes(self._audio.popleft())


async def _close(ws: aiohttp.ClientWebSocketResponse, code: int = aiohttp.WSCloseCode.OK) -> None:
    """Close without waiting long for the server: at gateway shutdown every bridged session
    closes at once, and a slow or stalled server (a full send buffer) must not hold the stop.
    Whatever is left is released when the component's HTTP session closes its connector."""
    with contextlib.suppress(TimeoutError, aiohttp.ClientError, ConnectionError):
        async with asyncio.timeout(CLOSE_WAIT_S):
            await ws.close(code=code)


def _json(data: str) -> dict[str, Any] | None:
    """A text frame as a JSON object within the bounds of every outside JSON (``topics.wire``:
    nesting, lone surrogates — the body may be relayed to a device); None to drop it."""
    try:
        body = load_json(data.encode("utf-8", "surrogatepass"), max_bytes=None)
    except PayloadError:
        return None
    return body if isinstance(body, dict) else None
