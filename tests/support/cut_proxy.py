"""A test tool: a TCP proxy that can cut the gateway off the broker without touching either.

:func:`cut_proxy` listens on a free loopback port and forwards each connection to the broker,
bytes unchanged. :meth:`CutProxy.cut` aborts every forwarded connection (both sides: the broker
sees its client's socket close, as when a network link dies) and turns new connections away
(accepted, then closed) until :meth:`CutProxy.restore`. Nothing is forwarded while cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

from devstack.broker import free_port

_CHUNK = 65_536


class CutProxy:
    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.listen_port = 0
        self.forwarded = 0  # connections forwarded to the broker
        self.turned_away = 0  # connections closed at once while cut
        self._down = False
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.listen_port}"

    @property
    def live(self) -> int:
        """Connections being forwarded now."""
        return len(self._links)

    def cut(self) -> None:
        """Abort every forwarded connection; turn new ones away until :meth:`restore`."""
        self._down = True
        for client, upstream in list(self._links):
            client.transport.abort()
            upstream.transport.abort()

    def restore(self) -> None:
        self._down = False

    async def start(self) -> None:
        self.listen_port = free_port(socket.SOCK_STREAM)
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.listen_port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            if self._down:
                self.turned_away += 1
                writer.transport.abort()
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
            except OSError:
                writer.transport.abort()
                return
            if self._down:  # cut while connecting
                writer.transport.abort()
                up_writer.transport.abort()
                return
            link = (writer, up_writer)
            self._links.add(link)
            self.forwarded += 1
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(_pipe(reader, up_writer), name="cut_proxy.to_broker")
                    tg.create_task(_pipe(up_reader, writer), name="cut_proxy.to_client")
            finally:
                self._links.discard(link)
        finally:
            self._handlers.discard(task)


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """Copy until ``src`` ends, then close ``dst`` (its buffered bytes still go out); on an
    error (a cut) abort it."""
    try:
        while data := await src.read(_CHUNK):
            dst.write(data)
            await dst.drain()
    except OSError:
        dst.transport.abort()
        return
    dst.close()


@contextlib.asynccontextmanager
async def cut_proxy(host: str, port: int) -> AsyncIterator[CutProxy]:
    """A :class:`CutProxy` to ``host:port``, listening until the block exits."""
    proxy = CutProxy(host, port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()
