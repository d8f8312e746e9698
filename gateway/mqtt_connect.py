"""``async with connected(client)``: aiomqtt's ``async with client`` whose connect survives a
cancellation cleanly.

aiomqtt connects in an executor thread (paho's ``connect`` blocks), and cancelling the awaiting
task does not stop that thread: it goes on to open the socket and to register it with the loop
(``add_reader``/``add_writer`` via ``call_soon_threadsafe``). Closing the socket while the thread
is still at work made the loop register a dead descriptor ("Exception in callback add_writer
... Bad file descriptor"); not closing it left the socket to paho's ``__del__``, which runs after
the loop is closed ("Event loop is closed" traceback at exit). Both showed when the gateway
failed to start (a port taken) while its broker connect was under way.

So the connect runs as its own task, shielded: a cancellation lets it finish (bounded by
``SETTLE_S``; on loopback it takes milliseconds), then the client disconnects properly while the
loop runs (bounded the same), then the cancellation goes on. Only a connect still blocked after ``SETTLE_S`` (an
unreachable broker) falls back to closing paho's sockets under it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiomqtt

SETTLE_S = 3.0


@contextlib.asynccontextmanager
async def connected(client: aiomqtt.Client) -> AsyncIterator[aiomqtt.Client]:
    # Owned here, not by a TaskGroup: shield() needs a task, and every path below awaits it to
    # its end or, past SETTLE_S, cancels it (see _settle); it never outlives this function.
    enter = asyncio.create_task(_enter(client), name="mqtt.connect")
    try:
        await asyncio.shield(enter)
    except asyncio.CancelledError:
        await _settle(client, enter)
        raise
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_exit(client)  # disconnects on the way out, as ``async with`` does
        yield client


async def _enter(client: aiomqtt.Client) -> None:
    await client.__aenter__()


async def _settle(client: aiomqtt.Client, enter: asyncio.Task[None]) -> None:
    """The connect was cancelled: let it finish, then leave nothing open."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(SETTLE_S):
            await asyncio.shield(enter)
    if enter.done() and not enter.cancelled() and enter.exception() is None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(SETTLE_S):
                await client.__aexit__(None, None, None)  # DISCONNECT, sockets closed on the loop
    else:
        enter.cancel()
    with contextlib.suppress(Exception):
        client._client._reset_sockets()  # paho's own cleanup (no public equivalent); idempotent
