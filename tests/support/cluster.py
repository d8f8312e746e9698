"""Gateway *processes* for the scale-out tests (the dev stack's :class:`GatewayProcess`): each
with its own id, data dir, ephemeral ports and log file, all on one broker and one store.

A process is killed with SIGKILL (no shutdown path: the broker publishes its LWT). The
ownership log is read back from each log file: the task runtime logs ``ownership gained DEV
at_ms=T`` when it starts acting for a device and ``ownership released DEV at_ms=T`` when it
stops (gateway/tasks/service.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from devstack.gateway import Use, gateway_sections
from devstack.process import GatewayProcess
from tests.support.broker import Broker

OWNERSHIP = re.compile(r"ownership (gained|released) (\S+) at_ms=(\d+)")


def cluster_gateway(root: Path, gateway_id: str, sections: dict[str, Any]) -> GatewayProcess:
    """One gateway process of the test cluster: its own id and data dir under ``root``."""
    settings = {**sections, "gateway_id": gateway_id, "data_dir": str(root / "data")}
    return GatewayProcess(root, settings)


def ownership(gw: GatewayProcess) -> list[tuple[str, str, int]]:
    """``(event, device, at_ms)`` in the order of ``gw``'s log."""
    text = gw.log_path.read_text(errors="replace")
    return [(m[1], m[2], int(m[3])) for m in OWNERSHIP.finditer(text)]


def cluster_sections(
    broker: Broker, *, store_url: str, catalog: Path, min_window_ms: int, heartbeat_s: float
) -> dict[str, Any]:
    """Settings every gateway of the test cluster shares (ids and data dirs are per process):
    the dev stack's, plus the store, the cluster and the lesson timing."""
    return gateway_sections(
        broker,
        use=Use.TEST,
        store={"url": store_url},
        cluster={"enabled": True, "handover_delay_s": 1.0},
        asr={"engine": "none"},
        # generous: on two busy cores a board's audio.completed can take seconds to be handled,
        # and the test is about ownership, not the clip watchdog
        runtime={
            "catalog_path": str(catalog),
            "min_window_ms": min_window_ms,
            "completion_grace_ms": 60_000,
        },
        board={"heartbeat_s": heartbeat_s},
        ops={"metrics_interval_s": 0.5, "shutdown_timeout_s": 3.0, "log_level": "INFO"},
    )


def intervals(gateways: list[GatewayProcess], end_ms: int) -> dict[str, list[tuple[int, int, str]]]:
    """Per device, the ``(from_ms, to_ms, gateway)`` spans during which a gateway acted for it
    up to ``end_ms`` (what the shutdown of the test cluster moves later is not looked at); a span
    still open ends at the gateway's kill time, else at ``end_ms``."""
    spans: dict[str, list[tuple[int, int, str]]] = {}
    for gw in gateways:
        open_since: dict[str, int] = {}
        for event, dev, at in ownership(gw):
            if at > end_ms:
                break
            if event == "gained":
                assert dev not in open_since, f"{gw.gateway_id} gained {dev} twice"
                open_since[dev] = at
            else:
                start = open_since.pop(dev)
                spans.setdefault(dev, []).append((start, at, gw.gateway_id))
        for dev, start in open_since.items():
            spans.setdefault(dev, []).append((start, gw.killed_at_ms or end_ms, gw.gateway_id))
    return spans
