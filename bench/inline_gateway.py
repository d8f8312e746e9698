"""The inline budget bench's gateway process: the dev stack's (:func:`devstack.process.serve`)
warmed up before it says it serves, as a gateway that has run a while would be: one
transcription per ASR worker (every pocketsphinx worker started, its model loaded) and, with
``speech.presynth``, the catalog's phrases prepared. ``python -m bench.inline_gateway SPEC.json``
(started by :mod:`bench.inline_budget`)."""

from __future__ import annotations

import asyncio
import functools
import json
import sys
from pathlib import Path

from devstack.process import die_with_parent, serve
from gateway.app import Gateway
from gateway.assessment.jobs import AsrKey
from tests.support.speech import silence, synthesize

WARM_UP_TIMEOUT_S = 600.0  # the phrase preparation runs at the lowest priority


async def warm_up(gw: Gateway, *, workers: int, presynth: bool) -> None:
    pcm = synthesize("it is seven") + silence(700)
    loop = asyncio.get_running_loop()
    done: list[asyncio.Future[str | None]] = []
    for i in range(workers):
        future: asyncio.Future[str | None] = loop.create_future()
        done.append(future)
        gw.assessment.transcribe(
            AsrKey("warm-up", i, f"warm-{i}"), pcm, ("it is seven",), future.set_result
        )
    async with asyncio.timeout(WARM_UP_TIMEOUT_S):
        await asyncio.gather(*done)
        if gw.speech is not None and presynth:
            await gw.speech.prepared.wait()


def main() -> int:
    die_with_parent()
    spec = json.loads(Path(sys.argv[1]).read_text())
    settings = spec["settings"]
    warm = functools.partial(
        warm_up,
        workers=int(settings["asr"]["workers"]),
        presynth=bool(settings.get("speech", {}).get("presynth", True)),
    )
    asyncio.run(serve(spec, on_started=warm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
