"""A real WebSocket peer speaking the xiaozhi server protocol, for the CHAT bridge tests.

Built from the public protocol (xinnan-tech/xiaozhi-esp32-server's WebSocket server and
connection handler, 78/xiaozhi-esp32's websocket_protocol, the MQTT gateway docs — reference
§9, §10, §12), written here on aiohttp and sharing nothing with ``gateway/chat``:

* ``GET /xiaozhi/v1/`` upgrades; the headers (``device-id``, ``client-id``,
  ``protocol-version``, ``authorization``) and the query are recorded; with a configured token
  a wrong ``Authorization`` is refused with HTTP 401 before the upgrade;
* the client's ``hello`` is answered like the server does (``version`` 1, ``transport``
  websocket, a uuid4 ``session_id``, the client's own ``audio_params``);
* binary messages are parsed the way the server parses them: with ``?from=mqtt_gateway`` a
  16-byte header (timestamp at 8, length at 12), otherwise by ``Protocol-Version`` (1 raw,
  2 the 16-byte v2 header, 3 the 4-byte header);
* :meth:`PeerSession.speak` sends one turn the server's way: ``stt`` → ``tts start`` →
  ``tts sentence_start`` → audio (the first 5 frames at once, then one per 60 ms) → ``tts stop``,
  every message carrying its own ``session_id``; downlink frames use the server's gateway
  header ``[0]=1, [2..3]=len u16, [4..7]=seq, [8..11]=ts, [12..15]=len u32``.
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

PATH = "/xiaozhi/v1/"


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

    @property
    def from_gateway(self) -> bool:
        return self.query.get("from") == "mqtt_gateway"

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

    async def speak(self, frames: Sequence[bytes], *, text: str = "hi", heard: str = "") -> None:
        if heard:
            await self.send_json(type="stt", text=heard)
        await self.send_json(type="tts", state="start")
        await self.send_json(type="llm", text="🙂", emotion="happy")
        await self.send_json(type="tts", state="sentence_start", text=text)
        loop = asyncio.get_running_loop()
        start = loop.time()
        for seq, opus in enumerate(frames, start=1):
            delay = start + max(0, seq - 5) * 0.06 - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            ts = int(loop.time() * 1000) & 0xFFFFFFFF
            header = struct.pack(">BBHIII", 1, 0, len(opus), seq, ts, len(opus))
            await self.ws.send_bytes(header + opus)
        await asyncio.sleep(0.06 * 7)
        await self.send_json(type="tts", state="stop")


class XiaozhiServerPeer:
    def __init__(self, *, token: str | None = None) -> None:
        self.token = token
        self.sessions: list[PeerSession] = []
        self.refused = 0
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

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        headers = {k.lower(): v for k, v in request.headers.items()}
        if self.token is not None and headers.get("authorization") != f"Bearer {self.token}":
            self.refused += 1
            self.changed.set()
            raise web.HTTPUnauthorized
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        peer = PeerSession(headers, dict(request.query), ws, self.changed)
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
                        await ws.send_str(
                            json.dumps(
                                {
                                    "type": "hello",
                                    "version": 1,
                                    "transport": "websocket",
                                    "session_id": peer.session_id,
                                    "audio_params": body.get("audio_params"),
                                }
                            )
                        )
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


@contextlib.asynccontextmanager
async def xiaozhi_server(*, token: str | None = None) -> AsyncIterator[XiaozhiServerPeer]:
    peer = XiaozhiServerPeer(token=token)
    await peer.start()
    try:
        yield peer
    finally:
        await peer.stop()
