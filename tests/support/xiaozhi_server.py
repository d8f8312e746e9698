"""A real WebSocket peer speaking the xiaozhi server protocol, for the CHAT bridge tests.

xinnan-tech/xiaozhi-esp32-server is not on PyPI and its WebSocket core needs its whole provider
stack (VAD/ASR/LLM/TTS models, manager API), so it cannot run here. This peer follows its
connection handling and auth line by line as of release **v0.9.6** (2026-07-24, f5ed1aae;
unchanged on main 7475ea2b), written here on aiohttp and sharing nothing with ``gateway/chat``:

* ``core/websocket_server.py`` ``_handle_connection``: headers are read lower-cased; a request
  without ``device-id`` takes ``device-id``/``client-id``/``authorization`` from the query, and
  one with none gets the text "端口正常…" and a close; then ``_handle_auth``: with
  ``server.auth.enabled`` a device in ``allowed_devices`` passes, any other needs
  ``authorization: Bearer <token>`` that ``core/auth.py`` ``AuthManager.verify_token`` accepts
  (HMAC-SHA256 of ``client_id|device_id|ts`` under ``auth_key``, base64url without padding,
  ``.ts``, ``expire_seconds``); a refusal is the text ``认证失败`` and a close AFTER the upgrade;
* ``core/connection.py`` ``handle_connection``: ``conn_from_mqtt_gateway`` is
  ``request.path.endswith("?from=mqtt_gateway")``; the welcome is the ``xiaozhi`` config block
  (``type hello, version 1, transport websocket, audio_params opus/24000/1/60``) plus a uuid4
  ``session_id``;
* ``core/handle/helloHandle.py`` ``handleHelloMessage``: the client's ``audio_params`` replace
  the welcome's (``echo_client_audio``; False announces the configured ones, as the native-MQTT
  branch and servers configured that way do), ``features`` are kept, ``features.mcp`` starts
  ``initialize`` (id 1) → ``tools/list`` (id 2, same id for later pages) without a session id
  (``device_mcp/mcp_handler.py``);
* binary messages are parsed the way the server parses them: with ``?from=mqtt_gateway`` a
  16-byte header (timestamp at 8, length at 12), otherwise by ``Protocol-Version`` (1 raw,
  2 the 16-byte v2 header, 3 the 4-byte header);
* :meth:`PeerSession.speak` sends one turn the server's way: ``stt`` → ``tts start`` →
  ``tts sentence_start`` → audio (the first 5 frames at once, then one per frame duration) →
  ``tts stop``, every message carrying its own ``session_id``; downlink frames use the server's
  gateway header ``[0]=1, [2..3]=len u16, [4..7]=seq, [8..11]=ts, [12..15]=len u32``.

``token=`` is the older static-token check (``AuthMiddleware``'s ``tokens`` list) refused the
way a fronting proxy does, with HTTP 401 before the upgrade.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from gateway.chat.auth import AUTH_FAILED_TEXT, verify_hmac_token

PATH = "/xiaozhi/v1/"
PORT_OK_TEXT = "端口正常\uff0c如需测试连接\uff0c请启动digital-human测试"  # fullwidth commas
CONFIG_AUDIO = {"format": "opus", "sample_rate": 24000, "channels": 1, "frame_duration": 60}


@dataclass(frozen=True)
class ServerAuth:
    """``server.auth_key`` and ``server.auth`` of the server's config.yaml."""

    auth_key: str
    allowed_devices: frozenset[str] = frozenset()
    expire_seconds: int = 60 * 60 * 24 * 30


@dataclass
class PeerSession:
    headers: dict[str, str]
    query: dict[str, str]
    ws: web.WebSocketResponse
    changed: asyncio.Event
    session_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    hello: dict[str, Any] | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)  # JSON after hello
    audio: list[bytes] = field(default_factory=list)  # Opus payloads, in arrival order
    timestamps: list[int] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # time.monotonic() per audio frame
    closed: bool = False
    bad_frames: int = 0
    path_qs: str = ""
    features: dict[str, Any] = field(default_factory=dict)
    device_mcp: list[dict[str, Any]] = field(default_factory=list)  # the device's MCP payloads
    sent_times: list[float] = field(default_factory=list)  # time.monotonic() per audio frame sent

    @property
    def tools(self) -> list[Any]:
        return [
            t
            for m in self.device_mcp
            if m.get("id") == 2 and isinstance(m.get("result"), dict)
            for t in m["result"].get("tools", [])
        ]

    @property
    def from_gateway(self) -> bool:
        return self.path_qs.endswith("?from=mqtt_gateway")  # connection.py, verbatim

    def parse(self, data: bytes) -> bytes | None:
        if self.from_gateway:
            if len(data) < 16:
                return None
            ts, size = struct.unpack_from(">II", data, 8)
            self.timestamps.append(ts)
            return data[16 : 16 + size] if len(data) == 16 + size else None
        version = self.headers.get("protocol-version", "1")
        if version == "2":
            _, kind, _, ts, size = struct.unpack_from(">HHIII", data, 0)
            return data[16:] if kind == 0 and len(data) == 16 + size else None
        if version == "3":
            kind, _, size = struct.unpack_from(">BBH", data, 0)
            return data[4:] if kind == 0 and len(data) == 4 + size else None
        return data

    def named(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        return [
            m
            for m in self.messages
            if m.get("type") == kind and all(m.get(k) == v for k, v in match.items())
        ]

    async def send_json(self, **fields: Any) -> None:
        await self.ws.send_str(json.dumps({**fields, "session_id": self.session_id}))

    async def speak(
        self, frames: Sequence[bytes], *, text: str = "hi", heard: str = "", frame_s: float = 0.06
    ) -> None:
        if heard:
            await self.send_json(type="stt", text=heard)
        await self.send_json(type="tts", state="start")
        await self.send_json(type="llm", text="🙂", emotion="happy")
        await self.send_json(type="tts", state="sentence_start", text=text)
        loop = asyncio.get_running_loop()
        start = loop.time()
        for seq, opus in enumerate(frames, start=1):
            delay = start + max(0, seq - 5) * frame_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            ts = int(loop.time() * 1000) & 0xFFFFFFFF
            header = struct.pack(">BBHIII", 1, 0, len(opus), seq, ts, len(opus))
            self.sent_times.append(time.monotonic())
            await self.ws.send_bytes(header + opus)
        await asyncio.sleep(frame_s * 7)
        await self.send_json(type="tts", state="stop")


class XiaozhiServerPeer:
    def __init__(
        self,
        *,
        token: str | None = None,
        auth: ServerAuth | None = None,
        echo_client_audio: bool = True,
        audio: dict[str, Any] | None = None,
    ) -> None:
        self.token = token
        self.auth = auth
        self.echo_client_audio = echo_client_audio
        self.audio = audio or CONFIG_AUDIO
        self.sessions: list[PeerSession] = []
        self.refused = 0
        self.auth_refused = 0
        self.changed = asyncio.Event()
        self.answer_hellos = asyncio.Event()  # cleared: hellos are received but not answered
        self.answer_hellos.set()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}{PATH}"

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_get(PATH, self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        """Go down like a server process would: every WebSocket closed (GOING_AWAY)."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def wait_for(
        self, condition: Callable[[], bool], what: str, wait_s: float = 15.0
    ) -> None:
        try:
            async with asyncio.timeout(wait_s):
                while not condition():
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            raise AssertionError(f"peer: not seen within {wait_s}s: {what}") from None

    async def session(self, index: int = 0, wait_s: float = 15.0) -> PeerSession:
        """The ``index``-th session once its hello was answered."""
        await self.wait_for(
            lambda: len(self.sessions) > index and self.sessions[index].hello is not None,
            f"session {index} hello",
            wait_s,
        )
        return self.sessions[index]

    def _authenticated(self, headers: dict[str, str]) -> bool:
        """websocket_server._handle_auth + AuthManager.verify_token."""
        auth = self.auth
        if auth is None:
            return True
        device_id = headers.get("device-id")
        if auth.allowed_devices and device_id in auth.allowed_devices:
            return True
        token = headers.get("authorization", "")
        if not token.startswith("Bearer "):
            return False
        return verify_hmac_token(
            token[7:],
            auth.auth_key,
            client_id=headers.get("client-id"),
            device_id=device_id,
            now=int(time.time()),
            expire_s=auth.expire_seconds,
        )

    async def _handle(self, request: web.Request) -> web.StreamResponse:  # noqa: PLR0912 - the server's handler, step by step
        headers = {k.lower(): v for k, v in request.headers.items()}
        if self.token is not None and headers.get("authorization") != f"Bearer {self.token}":
            self.refused += 1
            self.changed.set()
            raise web.HTTPUnauthorized
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        if "device-id" not in headers:
            for key in ("device-id", "client-id", "authorization"):
                if key in request.query:
                    headers[key] = request.query[key]
            if "device-id" not in headers:
                await ws.send_str(PORT_OK_TEXT)
                await ws.close()
                return ws
        if not self._authenticated(headers):
            self.auth_refused += 1
            self.changed.set()
            await ws.send_str(AUTH_FAILED_TEXT)
            await ws.close()
            return ws
        peer = PeerSession(headers, dict(request.query), ws, self.changed)
        peer.path_qs = request.path_qs
        self.sessions.append(peer)
        self.changed.set()
        try:
            async for msg in ws:
                if msg.type is WSMsgType.TEXT:
                    body = json.loads(msg.data)
                    if body.get("type") == "hello" and peer.hello is None:
                        peer.hello = body
                        self.changed.set()
                        await self.answer_hellos.wait()
                        await self._hello(peer, body)
                    elif body.get("type") == "mcp" and isinstance(body.get("payload"), dict):
                        peer.messages.append(body)
                        await self._device_mcp(peer, body["payload"])
                    else:
                        peer.messages.append(body)
                elif msg.type is WSMsgType.BINARY:
                    opus = peer.parse(msg.data)
                    peer.arrivals.append(time.monotonic())
                    if opus is None:
                        peer.bad_frames += 1
                    else:
                        peer.audio.append(opus)
                self.changed.set()
        finally:
            peer.closed = True
            self.changed.set()
        return ws

    async def _hello(self, peer: PeerSession, body: dict[str, Any]) -> None:
        """helloHandle.handleHelloMessage."""
        welcome: dict[str, Any] = {
            "type": "hello",
            "version": 1,
            "transport": "websocket",
            "audio_params": dict(self.audio),
            "session_id": peer.session_id,
        }
        params = body.get("audio_params")
        if params and self.echo_client_audio:
            welcome["audio_params"] = params
        features = body.get("features")
        if isinstance(features, dict) and features:
            peer.features = features
        await peer.ws.send_str(json.dumps(welcome))
        if peer.features.get("mcp"):
            await self._mcp(peer, 1, "initialize", {"protocolVersion": "2024-11-05"})

    async def _mcp(
        self, peer: PeerSession, rid: int, method: str, params: dict[str, Any] | None = None
    ) -> None:
        payload: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            payload["params"] = params
        await peer.ws.send_str(json.dumps({"type": "mcp", "payload": payload}))

    async def _device_mcp(self, peer: PeerSession, payload: dict[str, Any]) -> None:
        """mcp_handler.handle_mcp_message: initialize's result → tools/list (id 2), pages on."""
        peer.device_mcp.append(payload)
        result = payload.get("result")
        if not isinstance(result, dict):
            return
        if payload.get("id") == 1:
            await peer.ws.send_str(
                json.dumps(
                    {
                        "type": "mcp",
                        "payload": {"jsonrpc": "2.0", "method": "notifications/initialized"},
                    }
                )
            )
            await self._mcp(peer, 2, "tools/list")
        elif payload.get("id") == 2 and result.get("nextCursor"):
            await self._mcp(peer, 2, "tools/list", {"cursor": result["nextCursor"]})


@contextlib.asynccontextmanager
async def xiaozhi_server(
    *,
    token: str | None = None,
    auth: ServerAuth | None = None,
    echo_client_audio: bool = True,
    audio: dict[str, Any] | None = None,
) -> AsyncIterator[XiaozhiServerPeer]:
    peer = XiaozhiServerPeer(
        token=token, auth=auth, echo_client_audio=echo_client_audio, audio=audio
    )
    await peer.start()
    try:
        yield peer
    finally:
        await peer.stop()
