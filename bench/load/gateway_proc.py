"""The gateway as a process of its own, for the load harness.

``python -m bench.load.gateway_proc SPEC.json``: builds the production composition
(:func:`gateway.app.build_gateway`, what ``snlpgw run`` serves) from the settings in the spec,
prints one JSON line with its bound ports once the broker connection, HTTP, UDP and the task
runtime are up, and serves until SIGTERM/SIGINT (then a bounded clean shutdown).

``listen`` (streaming runs only): device ids whose microphone audio is decoded and run through
the VAD from their first datagram on, as if a listen window were open for each; in production
the task runtime turns that on per window (``XiaozhiChannel.set_listening``).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

from bench.load.procs import die_with_parent
from devstack.gateway import running_gateway
from gateway.logs import setup_logging
from gateway.settings import load_settings


async def serve(spec: dict[str, Any]) -> None:
    settings = load_settings(**spec["settings"])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with running_gateway(settings) as gw:
        for dev in spec.get("listen", []):
            gw.xiaozhi.set_listening(dev, True)
        ready = {"admin_port": gw.service.admin.port, "udp_port": gw.xiaozhi.udp_port}
        sys.stdout.write(json.dumps(ready) + "\n")
        sys.stdout.flush()
        await stop.wait()


def main() -> int:
    die_with_parent()
    spec = json.loads(Path(sys.argv[1]).read_text())
    setup_logging(spec.get("log_level", "WARNING"), json_lines=False)
    asyncio.run(serve(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
