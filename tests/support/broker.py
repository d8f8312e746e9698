"""The tests' broker: the dev stack's (:mod:`devstack.broker`), with the project's config.

:func:`start_broker` runs ``eclipse-mosquitto:2.0`` through testcontainers when a Docker engine
answers a ping, otherwise the local ``mosquitto`` binary on a free port; either is ready when
the gateway user completes an MQTT CONNECT — never after a sleep. Neither available → a clear
failure, never a skip. ``SNLPGW_TEST_BROKER=local|container`` forces one.

Used through the fixtures in ``tests/integration/conftest.py``: ``broker`` (session),
``fresh_broker`` (per test, may be stopped/started), ``device_id``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
from pathlib import Path

from devstack import broker as stack
from devstack.broker import Broker
from gateway.broker.credentials import Credentials
from gateway.broker.rules import GRANTS, Role

__all__ = ["Broker", "LostFirstSignal", "new_device_id", "start_broker", "start_variant"]


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


# -- broker variants (tests/integration/test_mqtt_conformance.py) -----------------------------

DYNSEC_PLUGIN = Path("/usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so")


def start_variant(data_dir: Path, config: str = "", *, deny_subscribe: str | None = None) -> Broker:
    """A local Mosquitto with the project's config (auth and ACLs on) plus ``config``'s lines,
    on one listener, so a per-listener option (``max_qos``) applies to the gateway's.

    ``deny_subscribe``: a subscription the broker refuses the gateway user (SUBACK 0x87).
    Mosquitto 2.0.11's ``acl_file`` never refuses a SUBSCRIBE (it filters at delivery), so the
    gateway user's rights move to the dynamic-security plugin: its grants as the ACL file has
    them, plus this denial; every other user keeps the ACL file."""
    broker = stack.start_broker(data_dir, device_listener=False, extra_config=f"\n{config}\n")
    if deny_subscribe is None:
        return broker
    broker.stop()
    dynsec = data_dir / "dynamic-security.json"
    dynsec.write_text(json.dumps(_dynsec_gateway(broker.gateway_credentials(), deny_subscribe)))
    with broker.files.config.open("a") as lines:
        lines.write(f"plugin {DYNSEC_PLUGIN}\nplugin_opt_config_file {dynsec}\n")
    broker.start()
    return broker


def _dynsec_gateway(creds: Credentials, deny_subscribe: str) -> dict[str, object]:
    """A dynamic-security config with the gateway user alone: its ACL-file grants, and
    ``deny_subscribe`` refused (checked first: higher priority)."""
    grants = GRANTS[Role.GATEWAY]
    acls: list[dict[str, object]] = [
        {"acltype": "subscribePattern", "topic": deny_subscribe, "priority": 10, "allow": False}
    ]
    for topic in grants.readwrite:
        for kind in ("publishClientSend", "publishClientReceive", "subscribePattern"):
            acls.append({"acltype": kind, "topic": topic, "priority": 0, "allow": True})
    for topic in grants.subscribe:
        for kind in ("publishClientReceive", "subscribePattern"):
            acls.append({"acltype": kind, "topic": topic, "priority": 0, "allow": True})
    assert creds.password is not None
    salt = secrets.token_bytes(12)
    key = hashlib.pbkdf2_hmac("sha512", creds.password.encode(), salt, 101, 64)
    return {
        "defaultACLAccess": {
            "publishClientSend": False,
            "publishClientReceive": False,
            "subscribe": False,
            "unsubscribe": True,
        },
        "clients": [
            {
                "username": creds.username,
                "password": base64.b64encode(key).decode(),
                "salt": base64.b64encode(salt).decode(),
                "iterations": 101,
                "roles": [{"rolename": "gateway"}],
            }
        ],
        "groups": [],
        "roles": [{"rolename": "gateway", "acls": acls}],
    }
