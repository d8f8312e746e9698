"""The tests' broker: the dev stack's (:mod:`devstack.broker`), with the project's config.

:func:`start_broker` runs ``eclipse-mosquitto:2.0`` through testcontainers when a Docker engine
answers a ping, otherwise the local ``mosquitto`` binary on a free port; either is ready when
the gateway user completes an MQTT CONNECT — never after a sleep. Neither available → a clear
failure, never a skip. ``SNLPGW_TEST_BROKER=local|container`` forces one.

Used through the fixtures in ``tests/integration/conftest.py``: ``broker`` (session),
``fresh_broker`` (per test, may be stopped/started), ``device_id``.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from devstack import broker as stack
from devstack.broker import Broker

__all__ = ["Broker", "LostFirstSignal", "new_device_id", "start_broker"]


def start_broker(data_dir: Path, *, split: bool = False) -> Broker:
    """A broker with a device listener; ``split``: the first listener admits no device user
    (the config `snlpgw broker init` and `make run` write)."""
    forced = os.environ.get("SNLPGW_TEST_BROKER", "")
    backend: stack.BackendName = "auto"
    if forced in ("local", "container"):
        backend = "local" if forced == "local" else "container"
    return stack.start_broker(data_dir, split=split, backend=backend)


def new_device_id() -> str:
    """A random board id in the device form (``aa_bb_cc_dd_ee_ff``): a unicast, locally
    administered MAC, as the OTA endpoint accepts only unicast device MACs."""
    raw = bytearray(secrets.token_bytes(6))
    raw[0] = (raw[0] & 0xFC) | 0x02
    return "_".join(f"{b:02x}" for b in raw)


class LostFirstSignal:
    """A reloader for ``broker`` whose first signal goes nowhere: what happens when a SIGHUP
    reaches Mosquitto during another reload (the broker clears its reload flag when a reload
    ends, dropping the new signal)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        if self.calls > 1:
            self.broker.reload()
