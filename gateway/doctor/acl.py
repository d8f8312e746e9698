"""Doctor ACL check: a freshly provisioned throwaway device must not read or write another
device's topics, while it can read its own. The device is revoked afterwards.

Needs the broker files in the data dir (``snlpgw broker init``) and the gateway's login (to
publish the messages the device should and should not see). The other device need not exist.
"""

from __future__ import annotations

import contextlib
import secrets
import ssl

from gateway.broker.credentials import BrokerFiles, gateway_mqtt_password, provision, revoke
from gateway.broker.io import Reloader
from gateway.doctor.network import Findings
from gateway.doctor.report import Row, fail, ok, skip
from gateway.mqtt.probe import Probe, await_login
from gateway.mqtt.tls import broker_context
from gateway.settings import Settings
from gateway.xiaozhi.ota.provisioning import device_endpoint

NAME = "ACL isolation"
WAIT_S = 5.0
_DENIED = 0x80  # SUBACK / PUBACK reason codes at or above this are refusals


def throwaway_device_id() -> str:
    raw = bytearray(secrets.token_bytes(6))
    raw[0] = (raw[0] & 0xFC) | 0x02  # locally administered unicast: never a real board
    return "_".join(f"{b:02x}" for b in raw)


def check_acl(settings: Settings, found: Findings, reload: Reloader) -> Row:
    if not found.gateway_login:
        return skip(NAME, "needs the broker and the gateway's login (see above)")
    data_dir = settings.data_dir
    if not BrokerFiles.at(data_dir).registry.exists():
        return skip(NAME, f"no broker files in {data_dir} (broker managed elsewhere)")
    me, other = throwaway_device_id(), throwaway_device_id()
    try:
        creds = provision(data_dir, me, role="device", reload=reload)
    except Exception as exc:
        return fail(NAME, f"cannot provision a test device: {exc}"[:200])
    try:
        # Wait for the reload (signalling again if it was lost) before the isolation check.
        host, port, tls = device_endpoint(settings)
        context = _gateway_tls(settings, host, port)
        await_login(
            host, port, me, creds.password, within_s=WAIT_S, tls=tls, context=context,
            reload=reload,
        )  # fmt: skip
        return _probe(settings, me, other, creds.password)
    finally:
        with contextlib.suppress(Exception):
            revoke(data_dir, me, reload=reload)


def _login(
    settings: Settings, user: str, password: str | None, *, device: bool = False
) -> Probe | None:
    mqtt = settings.mqtt
    # With a device listener the gateway's listener admits no device user.
    host, port, tls = device_endpoint(settings) if device else (mqtt.host, mqtt.port, mqtt.tls)
    # One attempt: check_acl waited for the device's reload (await_login), and the gateway's
    # login was checked before this row.
    probe = Probe(host, port, user, password, tls=tls, context=_gateway_tls(settings, host, port))
    with contextlib.suppress(OSError):
        if probe.connect(WAIT_S) == 0:
            return probe
    probe.close()
    return None


def _gateway_tls(settings: Settings, host: str, port: int) -> ssl.SSLContext | None:
    """On the gateway's own listener, its TLS settings (``mqtt.ca_file``, client certificate;
    the broker row has read the files); elsewhere (boards' listener) ``None``: the system's
    CAs, as boards trust."""
    mqtt = settings.mqtt
    return broker_context(mqtt) if (host, port) == (mqtt.host, mqtt.port) else None


def _probe(settings: Settings, me: str, other: str, password: str | None) -> Row:
    device = _login(settings, me, password, device=True)
    if device is None:
        return fail(NAME, f"test device {me} could not log in after provisioning (broker reload?)")
    gateway = _login(settings, settings.mqtt.username, gateway_mqtt_password(settings))
    try:
        if gateway is None:
            return fail(NAME, "the gateway user could not log in to publish test messages")
        return _exchange(device, gateway, me, other)
    finally:
        device.close()
        if gateway is not None:
            gateway.close()


def _exchange(device: Probe, gateway: Probe, me: str, other: str) -> Row:
    mine, theirs = f"snlp/v1/{me}/cmd", f"snlp/v1/{other}/cmd"
    mid_theirs = device.subscribe(theirs, qos=1) or -1  # None: not sent
    mid_mine = device.subscribe(mine, qos=1) or -1
    device.pump_until(lambda: {mid_theirs, mid_mine} <= device.granted.keys(), WAIT_S)
    if not device.granted.get(mid_mine, [_DENIED])[0] < _DENIED:
        return fail(NAME, f"device {me} may not subscribe to its own {mine}")
    # Published in this order by one client: once the device has its own message, the other
    # device's (sent first) would have arrived already if the broker let it through.
    sent = [
        gateway.publish(theirs, b"doctor: not for you", qos=1),
        gateway.publish(mine, b"doctor: yours", qos=1),
    ]
    gateway.pump_until(lambda: all(number in gateway.acked for number in sent), WAIT_S)
    got = device.pump_until(lambda: any(m.topic == mine for m in device.received), WAIT_S)
    if not got:
        return fail(NAME, f"device {me} did not receive a message on its own {mine}")
    if any(m.topic == theirs for m in device.received):
        return fail(NAME, f"device {me} READ another device's {theirs}")
    puback = _puback(device, f"snlp/v1/{other}/evt")
    if puback is None or puback < _DENIED:
        return fail(NAME, f"device {me} may PUBLISH to another device's snlp/v1/{other}/evt")
    suback = device.granted.get(mid_theirs, [0])[0]
    how = "subscription refused" if suback >= _DENIED else "subscription granted, nothing delivered"
    return ok(
        NAME, f"test device: another's cmd not readable ({how}); evt publish refused ({puback})"
    )


def _puback(device: Probe, topic: str) -> int | None:
    number = device.publish(topic, b"doctor", qos=1)
    device.pump_until(lambda: number in device.acked, WAIT_S)
    return None if number is None else device.acked.get(number)
