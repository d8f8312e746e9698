"""The chat benchmark's upstream: the xiaozhi server peer (tests/support) in its own process.

Prints ``{"url": ...}`` once listening; on a line on stdin, prints every session's frame
arrival times (``time.monotonic()``, comparable across processes on Linux) by device id, then
exits.
"""

from __future__ import annotations

import asyncio
import json
import sys

from tests.support.xiaozhi_server import xiaozhi_server


async def main_async() -> None:
    async with xiaozhi_server() as peer:
        sys.stdout.write(json.dumps({"url": peer.url}) + "\n")
        sys.stdout.flush()
        await asyncio.to_thread(sys.stdin.readline)
        arrivals: dict[str, list[float]] = {}
        for session in peer.sessions:
            arrivals.setdefault(session.headers.get("device-id", "?"), []).extend(session.arrivals)
        sys.stdout.write(
            json.dumps({"arrivals": arrivals, "bad": sum(s.bad_frames for s in peer.sessions)})
            + "\n"
        )
        sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main_async())
