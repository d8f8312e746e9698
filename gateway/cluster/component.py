"""The cluster component: membership from the broker, ownership answers for the channels and
the task runtime, and this gateway's UDP endpoint announced in its retained status.

* Routes ``snlpgw/v1/gw/+/status`` (QoS 1); every gateway sees every status (not a shared
  subscription: membership must be the same everywhere).
* :class:`Ownership` is built before the components that ask it: :meth:`Ownership.owns` is what
  the board channel, the Xiaozhi control handler and the task runtime ask before acting for a
  device. With ``cluster.enabled`` false it is always true (one gateway).
* The ``listeners`` given to :class:`Cluster` are called on the loop whenever ownership may
  have changed: settled, a gateway joined or left, or our broker connection dropped.
* Ownership log: each change of the live set is logged once (``cluster members …``); the task
  runtime logs each device it starts or stops acting for (``ownership gained|released``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from pydantic import ValidationError

from gateway.cluster.membership import Membership
from gateway.mqtt.edge import Inbound
from topics import GatewayStatus, TopicKind, build_topic, encode

if TYPE_CHECKING:
    from gateway.service import Context

log = logging.getLogger(__name__)

OwnershipListener = Callable[[], None]


class UdpAnnouncer(Protocol):
    """The Xiaozhi channel: its announced UDP endpoint, known once the socket is bound."""

    async def wait_ready(self) -> None: ...

    @property
    def udp_host(self) -> str: ...

    @property
    def udp_port(self) -> int: ...


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Ownership:
    """Which devices this gateway acts for: all of them alone, else the rendezvous owner's
    over the live members (the cluster component keeps the membership current)."""

    def __init__(
        self, gateway_id: str, *, enabled: bool, wall_ms: Callable[[], int] = _wall_ms
    ) -> None:
        self.enabled = enabled
        self.membership = Membership(gateway_id)
        self.membership.reset(wall_ms())

    def owns(self, dev: str) -> bool:
        return not self.enabled or self.membership.owns(dev)


class Cluster:
    name = "cluster"

    def __init__(
        self,
        *,
        ctx: Context,
        ownership: Ownership,
        udp: UdpAnnouncer,
        listeners: Iterable[OwnershipListener] = (),
        wall_ms: Callable[[], int] = _wall_ms,
    ) -> None:
        self.enabled = ownership.enabled
        self.ownership = ownership
        self.membership = ownership.membership
        self._udp = udp
        self._wall_ms = wall_ms
        self._listeners = tuple(listeners)
        self._mqtt = ctx.mqtt
        members = ctx.metrics.gauge("cluster_members", "Live gateways this gateway sees")
        members.set_function(lambda: float(len(self.membership.live)))
        settled = ctx.metrics.gauge("cluster_settled", "1 while this gateway may own devices")
        settled.set_function(lambda: float(self.membership.settled or not self.enabled))
        self._m_changes = ctx.metrics.counter(
            "cluster_changes", "Ownership changes seen (joins, leaves, settle, unsettle)"
        )
        if self.enabled:
            ctx.mqtt.route("snlpgw/v1/gw/+/status", self._on_status, qos=1)

    def owns(self, dev: str) -> bool:
        return self.ownership.owns(dev)

    async def run(self) -> None:
        if not self.enabled:
            return
        mqtt = self._mqtt
        await self._udp.wait_ready()
        while True:
            await mqtt.wait_connected()
            self._announce()
            await mqtt.wait_disconnected()
            if self.membership.reset(self._wall_ms()):
                log.warning("cluster: broker connection lost; owning nothing until back")
                self._changed()

    def _announce(self) -> None:
        """Our status again, now with the UDP endpoint (the connection's own presence message
        is written before the channels are up)."""
        gw = self.membership.self_id
        udp = f"{self._udp.udp_host}:{self._udp.udp_port}"
        body = GatewayStatus(online=True, gateway_id=gw, ts=self._wall_ms(), udp=udp)
        self._mqtt.publish(
            build_topic(TopicKind.GW_STATUS, gw=gw), encode(body), qos=1, retain=True
        )

    def _on_status(self, msg: Inbound) -> None:
        if not msg.payload:
            return  # a cleared retained status
        try:
            status = GatewayStatus.model_validate_json(msg.payload)
        except ValidationError:
            log.warning("cluster: unreadable gateway status on %s", msg.topic)
            return
        if self.membership.update(status.gateway_id, online=status.online, ts_ms=status.ts):
            log.info(
                "cluster members %s (settled=%s) after %s %s",
                sorted(self.membership.live),
                self.membership.settled,
                status.gateway_id,
                "online" if status.online else "offline",
            )
            self._changed()

    def _changed(self) -> None:
        self._m_changes.inc()
        for listener in self._listeners:
            try:
                listener()
            except Exception:
                log.exception("cluster listener failed")
