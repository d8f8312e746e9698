"""A local OpenAI-compatible ``POST /v1/audio/transcriptions`` server backed by any engine.

``AsrServer(transcribe)`` serves on 127.0.0.1 (ephemeral port) inside ``async with``; a script
of ``ScriptedReply`` items (status, delay) can precede normal answers, to exercise timeouts and
retries. Sync engines (pocketsphinx) are called in a thread so the server stays responsive.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import wave
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType

from aiohttp import web

PATH = "/v1/audio/transcriptions"


@dataclass(frozen=True)
class ScriptedReply:
    """A scripted reply: ``status`` (200 = transcribe normally) after ``delay_s``."""

    status: int = 200
    delay_s: float = 0.0


@dataclass(frozen=True)
class Request:
    model: str
    response_format: str
    pcm: bytes


class AsrServer:
    def __init__(
        self, transcribe: Callable[[bytes], str], script: Iterable[ScriptedReply] = ()
    ) -> None:
        self._transcribe = transcribe
        self.script: deque[ScriptedReply] = deque(script)
        self.requests: list[Request] = []
        self._runner: web.AppRunner | None = None
        self._closing = asyncio.Event()
        self.url = ""

    async def _handle(self, request: web.Request) -> web.Response:
        form = await request.post()
        upload = form.get("file")
        for value in form.values():  # aiohttp spools uploads to temporary files
            if isinstance(value, web.FileField) and value is not upload:
                value.file.close()
        if not isinstance(upload, web.FileField):
            return web.json_response({"error": "file missing"}, status=400)
        with upload.file as fh:
            data = fh.read()
        try:
            with wave.open(io.BytesIO(data), "rb") as w:
                if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (16000, 1, 2):
                    return web.json_response({"error": "want 16 kHz mono s16"}, status=400)
                pcm = w.readframes(w.getnframes())
        except (wave.Error, EOFError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        self.requests.append(
            Request(str(form.get("model", "")), str(form.get("response_format", "")), pcm)
        )
        reply = self.script.popleft() if self.script else ScriptedReply()
        if reply.delay_s:  # ends early when the server closes, so no handler outlives it
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(reply.delay_s):
                    await self._closing.wait()
        if reply.status != 200:
            return web.json_response({"error": "scripted"}, status=reply.status)
        text = await asyncio.to_thread(self._transcribe, pcm)
        return web.json_response({"text": text})

    async def __aenter__(self) -> AsrServer:
        app = web.Application()
        app.router.add_post(PATH, self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server  # aiohttp exposes the bound port only here
        assert server is not None
        port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{port}{PATH}"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
