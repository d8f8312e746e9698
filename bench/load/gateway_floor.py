"""The streaming benchmark's gateway process: the dev stack's (:func:`devstack.process.serve`)
with the floor measured on its own event loop's thread (:class:`bench.load.floor.ThreadFloor`)
while it serves. ``python -m bench.load.gateway_floor SPEC.json``; the floor's samples are
written to the spec's ``floor_out`` as the process ends (SIGTERM; a process killed instead
writes none, and the harness reports the run without a floor)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from bench.load.floor import ThreadFloor
from devstack.process import die_with_parent, serve


def main() -> int:
    die_with_parent()
    spec = json.loads(Path(sys.argv[1]).read_text())
    floor = ThreadFloor()  # speech and the first pass before the gateway starts
    try:
        asyncio.run(serve(spec, on_ready=floor.start))
    finally:
        floor.close()
        Path(spec["floor_out"]).write_text(json.dumps(floor.samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
