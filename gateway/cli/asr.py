"""``snlpgw asr-serve``: the embedded ASR engine as an OpenAI-compatible HTTP service
(``gateway/assessment/serve.py``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Any

from gateway.logs import setup_logging


def _cmd_asr_serve(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    from gateway.assessment.procslot import ProcessBackend  # noqa: PLC0415 - keeps the CLI light
    from gateway.assessment.serve import AsrService  # noqa: PLC0415
    from gateway.assessment.sphinx import PocketsphinxEngine  # noqa: PLC0415

    async def main() -> None:
        service = AsrService(
            backend=ProcessBackend(PocketsphinxEngine, name="pocketsphinx"),
            workers=args.workers,
            queue_limit=args.queue_limit,
            job_timeout_s=args.job_timeout_s,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with asyncio.TaskGroup() as tg:
            serving = tg.create_task(service.run(args.host, args.port), name="asr-serve")
            await stop.wait()
            serving.cancel()

    failed: list[BaseException] = []
    try:
        asyncio.run(main())
    except* OSError as group:  # a port in use: say so, no traceback
        failed.extend(group.exceptions)
    for exc in failed:
        print(f"snlpgw asr-serve: cannot start / 无法启动: {exc}", file=sys.stderr)  # noqa: T201
    return 2 if failed else 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def add_asr_commands(sub: Any) -> None:  # argparse._SubParsersAction (private)
    serve = sub.add_parser(
        "asr-serve",
        help="serve the embedded ASR engine as OpenAI-compatible POST /v1/audio/transcriptions",
    )
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument(
        "--workers",
        type=_positive,
        default=os.cpu_count() or 1,
        help="engine worker processes, one job each at a time (default: the CPU count)",
    )
    serve.add_argument(
        "--queue-limit",
        type=_positive,
        default=64,
        help="requests waiting for a worker; when full the oldest is answered 503 (default 64)",
    )
    serve.add_argument(
        "--job-timeout-s", type=float, default=30.0, help="per-job limit (default 30)"
    )
    serve.add_argument("--log-level", default="INFO", help="log level (default INFO)")
    serve.set_defaults(func=_cmd_asr_serve)
