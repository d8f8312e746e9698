"""``/xiaozhi/ota/`` and ``/xiaozhi/ota/activate`` on the device listener: the asyncio shell
around the trust book (:mod:`trust`), the rate limits (:mod:`limits`) and the wire format
(:mod:`wire`).

Per request, in order: parse (400), per-IP then per-MAC token bucket (429), the trust book's
verdict (credentials, an activation, or a refusal: 403 / 429), then the blocking part — persist
a changed binding, make the broker accept the device's derived password — on the endpoint's
own small executor (``xiaozhi.ota_workers`` threads, never the loop's default executor), at
most ``xiaozhi.ota_max_inflight`` requests at a time (more get 503). A bound board asking
again gets the same password and costs a locked read of the broker files, no write, no reload.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from gateway.broker.credentials import device_listener_port
from gateway.http import RouteTable
from gateway.settings import Settings
from gateway.xiaozhi.ota import wire
from gateway.xiaozhi.ota.limits import OtaLimitConfig, OtaLimits
from gateway.xiaozhi.ota.provisioning import Provisioner, unconfigured
from gateway.xiaozhi.ota.stats import OtaStats
from gateway.xiaozhi.ota.trust import Binding
from gateway.xiaozhi.ota.trust_store import (
    HmacKey,
    bindings_path,
    device_key,
    device_password,
    load_hmac_keys,
    save_bindings,
    trust_book_from,
)
from gateway.xiaozhi.stats import ChannelStats

log = logging.getLogger(__name__)

T = TypeVar("T")


_RETRY_AFTER_S = "30"


class OtaEndpoint:
    def __init__(
        self,
        *,
        settings: Settings,
        provision: Provisioner | None,
        stats: ChannelStats,
        http: RouteTable,
        revoke: Callable[[str], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``http``: the device listener (routes added here); ``revoke(dev)``: delete the
        device's broker user (blocking; on the OTA executor)."""
        x = settings.xiaozhi
        self._revoke = revoke
        self._settings = settings
        # Resolved once: the broker config changes only with a broker restart.
        self._endpoint = wire.mqtt_endpoint(settings, device_listener_port(settings.data_dir))
        self._configured = provision is not None
        self._provision: Provisioner = provision or unconfigured
        self._stats = stats
        self.stats = OtaStats(stats.metrics)
        self.clock = clock
        self._data_dir = Path(settings.data_dir)
        self.book = trust_book_from(settings, self._data_dir)
        self._key = device_key(self._data_dir)
        self._hmac_keys = load_hmac_keys(x.ota_hmac_keys_file)
        self._limits = OtaLimits(
            OtaLimitConfig(
                ip_per_min=x.ota_ip_per_min,
                ip_burst=x.ota_ip_burst,
                mac_per_min=x.ota_mac_per_min,
                mac_burst=x.ota_mac_burst,
                max_keys=4096,
            )
        )
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=x.ota_workers, thread_name_prefix="snlpgw-ota"
        )
        self._max_inflight = x.ota_max_inflight
        self._inflight = 0
        self._saved_revision = self.book.revision
        self._save_lock = threading.Lock()
        for path in wire.OTA_PATHS:
            http.add_route("POST", path, self.handle)
            http.add_route("GET", path, self.handle)
        for path in wire.ACTIVATE_PATHS:
            http.add_route("POST", path, self.handle_activate)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- handlers ------------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.Response:
        try:
            dev, client, now = await self._admit(request, wire.check_body)
        except _Early as early:
            return early.response
        serial = wire.serial_number(request.headers.get("Serial-Number"))
        proven = serial if self._key_for(serial, dev) is not None else None
        decision = self.book.request(dev, client, serial=proven, now=now)
        if decision.refusal is not None:  # Verdict.REFUSE
            reason = decision.refusal.value
            return self._refuse(403 if reason == "not_allowlisted" else 429, reason)
        if decision.pending is not None:  # Verdict.ACTIVATE
            return self._activation(dev, decision.pending.code, decision.pending.challenge)
        if decision.new_binding:
            log.info("OTA binds %s to its first Client-Id", dev)
        board = wire.board_name(request.headers.get("User-Agent"))
        password = device_password(self._key, dev, decision.client_id, decision.generation)
        return await self._credentials(dev, client, board, password)

    async def handle_activate(self, request: web.Request) -> web.Response:
        claim = wire.ActivateBody()

        def parse(body: bytes, _: str) -> None:
            nonlocal claim
            claim = wire.activate_body(body)

        try:
            dev, client, now = await self._admit(request, parse)
        except _Early as early:
            return early.response
        key = self._key_for(claim.serial, dev)
        outcome = self.book.activate(
            dev,
            client,
            challenge=claim.challenge,
            signature=claim.signature,
            serial=claim.serial,
            key=key.key if key is not None else None,
            now=now,
        )
        self.stats.activations.labels(f"activate_{outcome.value}").inc()
        try:
            await self.persist()
        except _Busy:
            return self._refuse(503, "busy")
        except OSError:
            log.exception("saving OTA bindings failed")
            return self._reply(500, {"error": "activation could not be saved"})
        return self._reply(wire.ACTIVATE_STATUS[outcome], {"status": outcome.value})

    # -- used by the admin API too ---------------------------------------------------------------

    async def persist(self) -> None:
        """Write the bindings if they changed since the last write (on the OTA executor)."""
        unsaved = self._unsaved()
        if unsaved is not None:
            await self._run(self._save, *unsaved)

    async def forget(self, dev: str) -> bool:
        """Unbind ``dev`` and delete its broker user (an operator clearing junk or a sold
        board); False when it was not bound."""
        if not self.book.forget(dev):
            return False
        await self._run(self._forget_job, self._unsaved(), dev)
        return True

    # -- internals -------------------------------------------------------------------------------

    def _forget_job(self, unsaved: tuple[int, dict[str, Binding]] | None, dev: str) -> None:
        if unsaved is not None:
            self._save(*unsaved)
        if self._revoke is not None:
            self._revoke(dev)

    async def _admit(
        self, request: web.Request, check: Callable[[bytes, str], None]
    ) -> tuple[str, str, float]:
        """Headers, body, rate limits: ``(dev, client uuid, now)`` or :class:`_Early`."""
        try:
            dev = wire.device_id_from_mac(request.headers.get("Device-Id"))
            client = wire.client_uuid(request.headers.get("Client-Id"))
            check(await request.read(), dev)
        except wire.OtaRefused as exc:
            raise _Early(self._reply(400, {"error": str(exc)})) from None
        now = self.clock()
        # Per MAC *and* Client-Id: someone spoofing a board's MAC drains only their own bucket.
        limited = self._limits.check(ip=request.remote or "-", dev=f"{dev}/{client}", now=now)
        if limited is not None:
            raise _Early(self._refuse(429, limited.value))
        if not self._configured:
            raise _Early(self._reply(503, {"error": "device provisioning is not configured"}))
        return dev, client, now

    async def _credentials(self, dev: str, client: str, board: str, password: str) -> web.Response:
        try:
            await self._run(self._provision_job, self._unsaved(), self._provision, dev, password)
        except _Busy:
            return self._refuse(503, "busy")
        except Exception:
            log.exception("provisioning %s failed", dev)
            return self._reply(500, {"error": "provisioning failed"})
        body = wire.ota_response(
            settings=self._settings,
            endpoint=self._endpoint,
            dev=dev,
            board=board,
            uuid_text=client,
            password=password,
            now_ms=time.time_ns() // 1_000_000,
        )
        return self._reply(200, body)

    def _activation(self, dev: str, code: str, challenge: str) -> web.Response:
        self.stats.activations.labels("issued").inc()
        log.info("OTA: %s asks with an unbound Client-Id; activation pending", dev)
        x = self._settings.xiaozhi
        body = wire.activation_response(
            code=code,
            challenge=challenge,
            message=wire.ACTIVATION_MESSAGE.format(code=code),
            timeout_ms=int(x.ota_code_ttl_s * 1000),
            now_ms=time.time_ns() // 1_000_000,
            firmware=x.firmware_version,
        )
        return self._reply(200, body)

    def _key_for(self, serial: str | None, dev: str) -> HmacKey | None:
        key = self._hmac_keys.get(serial) if serial is not None else None
        if key is None or (key.dev is not None and key.dev != dev):
            return None
        return key

    def _unsaved(self) -> tuple[int, dict[str, Binding]] | None:
        revision = self.book.revision
        return None if revision == self._saved_revision else (revision, self.book.bindings)

    def _provision_job(
        self,
        unsaved: tuple[int, dict[str, Binding]] | None,
        provision: Provisioner,
        dev: str,
        password: str,
    ) -> None:
        if unsaved is not None:  # a new binding is on disk before its credentials leave
            self._save(*unsaved)
        provision(dev, password)

    def _save(self, revision: int, snapshot: dict[str, Binding]) -> None:
        with self._save_lock:  # two workers: never let an older snapshot land last
            if revision <= self._saved_revision:
                return
            save_bindings(bindings_path(self._data_dir), snapshot)
            self._saved_revision = revision

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the OTA executor; :class:`_Busy` past ``ota_max_inflight``."""
        if self._inflight >= self._max_inflight:
            raise _Busy
        self._inflight += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._executor, fn, *args)
        finally:
            self._inflight -= 1

    def _refuse(self, status: int, reason: str) -> web.Response:
        self.stats.refused.labels(reason).inc()
        headers = {"Retry-After": _RETRY_AFTER_S} if status in (429, 503) else None
        return self._reply(status, {"error": reason}, headers)

    def _reply(
        self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> web.Response:
        self._stats.ota_requests.labels(str(status)).inc()
        return web.json_response(body, status=status, headers=headers)


class _Early(Exception):
    """A request answered before the trust book is asked (400, 429, 503)."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


class _Busy(Exception):
    """More OTA requests in progress than ``xiaozhi.ota_max_inflight``."""
