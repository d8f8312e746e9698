"""Optional manager reporter: ``PUT {manager_url}/task/instance/{id}`` after each change.

Best effort and never blocking: the store tells the reporter an instance changed
(:meth:`ManagerReporter.notify`, a dict insert); one sender task reads the instance's latest
snapshot from the store and PUTs it with ``Authorization: Bearer <secret>`` (never logged).

* Coalescing: an instance is pending at most once; its snapshot is read at send time, so only
  the latest state is ever sent. A change arriving during a send makes the instance pending
  again and it is sent once more afterwards.
* Bound: ``pending_limit`` instances. Overflow policy: the OLDEST pending instance is dropped
  and counted (``manager_dropped``); its next change makes it pending again.
* Retries: connection errors, timeouts, 408/429 and 5xx are retried ``retries`` times with
  exponential back-off (:mod:`gateway.backoff`: ``backoff_s`` doubling, capped at
  ``backoff_max_s``); other statuses
  fail at once. A snapshot that finally fails is counted (``manager_puts{result="failed"}``)
  and raises the ops alarm ``manager_failed`` (at most one per ``alarm_interval_s``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from urllib.parse import quote

import aiohttp

from gateway.backoff import BackoffPolicy
from gateway.metrics import Metrics
from gateway.store.alarms import AlarmFn, RateLimitedAlarm, no_alarm
from gateway.store.errors import StoreError
from gateway.store.store import Store

log = logging.getLogger(__name__)

_RETRY_STATUSES = frozenset({408, 429})


class _RetryablePut(Exception):
    pass


class ManagerReporter:
    name = "manager_reporter"

    def __init__(
        self,
        *,
        store: Store,
        url: str,
        secret: str | None,
        retries: int = 3,
        pending_limit: int = 1024,
        timeout_s: float = 5.0,
        backoff_s: float = 0.5,
        backoff_max_s: float = 10.0,
        alarm_interval_s: float = 60.0,
        metrics: Metrics | None = None,  # default: a registry of its own (tests, tools)
        alarm: AlarmFn = no_alarm,
    ) -> None:
        self._store = store
        self._base = url.rstrip("/")
        self._secret = secret
        self._retries = retries
        self._pending_limit = pending_limit
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._backoff = BackoffPolicy(backoff_s, backoff_max_s)
        self._alarm_interval_s = alarm_interval_s
        # Bounded: at most ``pending_limit`` ids; overflow drops the oldest (see module doc).
        self._pending: OrderedDict[str, None] = OrderedDict()
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        metrics = metrics or Metrics()
        self._puts = metrics.counter("manager_puts", "Manager API snapshot PUTs", ["result"])
        self._attempts = metrics.counter("manager_put_attempts", "Manager API HTTP attempts")
        self._dropped = metrics.counter("manager_dropped", "Pending manager snapshots dropped")
        self._depth = metrics.gauge("manager_pending", "Instances waiting for a manager PUT")
        self._alarm = RateLimitedAlarm("manager_failed", alarm, interval_s=self._alarm_interval_s)
        store.add_listener(self.notify)

    @property
    def pending(self) -> list[str]:
        """Instance ids waiting for a PUT, oldest first."""
        return list(self._pending)

    def notify(self, instance_id: str) -> None:
        """An instance changed; never blocks, never raises."""
        if instance_id not in self._pending:
            if len(self._pending) >= self._pending_limit:
                dropped, _ = self._pending.popitem(last=False)
                self._dropped.inc()
                log.warning("manager reporter full; dropped pending instance %s", dropped)
            self._pending[instance_id] = None
        self._depth.set(len(self._pending))
        self._idle.clear()
        self._wakeup.set()

    async def wait_idle(self) -> None:
        """Wait until nothing is pending or being sent."""
        await self._idle.wait()

    async def run(self) -> None:
        headers = {"Content-Type": "application/json"}
        if self._secret:
            headers["Authorization"] = f"Bearer {self._secret}"
        async with aiohttp.ClientSession(timeout=self._timeout, headers=headers) as session:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                while self._pending:
                    instance_id, _ = self._pending.popitem(last=False)
                    self._depth.set(len(self._pending))
                    await self._report(session, instance_id)
                self._idle.set()

    async def _report(self, session: aiohttp.ClientSession, instance_id: str) -> None:
        url = f"{self._base}/task/instance/{quote(instance_id, safe='')}"
        error = "no attempt"
        for attempt in range(self._retries + 1):
            if attempt:
                await asyncio.sleep(self._backoff.delay(attempt))
            try:
                body = await self._snapshot(instance_id)
            except StoreError as exc:
                error = f"store read failed: {exc}"
                continue
            if body is None:
                return  # never stored (or gone): nothing to report
            self._pending.pop(instance_id, None)  # this attempt carries the latest snapshot
            self._depth.set(len(self._pending))
            self._attempts.inc()
            try:
                await self._put(session, url, body)
            except _RetryablePut as exc:
                error = str(exc)
                continue
            except ValueError as exc:
                error = str(exc)
                break
            self._puts.labels("ok").inc()
            return
        self._puts.labels("failed").inc()
        log.warning("manager PUT for instance %s failed: %s", instance_id, error)
        self._alarm(instance_id=instance_id, error=error)

    async def _snapshot(self, instance_id: str) -> bytes | None:
        found = await self._store.get_instance(instance_id)
        if found is None:
            return None
        instance, steps = found
        doc = {"v": 1, "instance": instance.to_json(), "steps": [s.to_json() for s in steps]}
        return json.dumps(doc, separators=(",", ":")).encode()

    async def _put(self, session: aiohttp.ClientSession, url: str, body: bytes) -> None:
        try:
            async with session.put(url, data=body) as resp:
                await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _RetryablePut(f"{type(exc).__name__}: {exc}") from exc
        if 200 <= status < 300:
            return
        if status >= 500 or status in _RETRY_STATUSES:
            raise _RetryablePut(f"HTTP {status}")
        raise ValueError(f"HTTP {status} (not retried)")
