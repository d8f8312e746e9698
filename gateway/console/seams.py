"""What the console reads and asks of the rest of the gateway: small Protocols, and the adapters
over what main has today. Parallel work plugs in here (docs/console.md, "Seams"):

* :class:`ResultsSource`: a device's lesson history and one lesson's steps. Today: the store's
  ``instances`` and ``steps`` (:class:`StoreResults`); the results read-model replaces it.
* :class:`RecordingLinks`: a link to the child's recording of a step and to the reference clip.
  Today: none (:class:`NoRecordings`: the page says recordings are not available yet).
* :class:`LessonSteering`: start / pause / resume / stop on a device. Today: the task runtime's
  inbox, the same path as the MQTT control topic (:class:`InboxSteering`).
* :class:`FleetFacts`: what is known of a device (online, firmware, RSSI, SD free, last seen,
  alarms). Today: "online" from the board channel and the device's recent ops alarms
  (:class:`BoardFacts`); the rest is ``None`` ("not reported") until device status lands.
* :class:`ActivationApprovals`: OTA activation codes waiting, and approving one. Today: the
  OTA endpoint's trust book (:class:`OtaApprovals`), the same as ``POST /admin/devices/approve``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from gateway.store.records import InstanceRecord, StepRecord
from gateway.store.store import Store
from gateway.tasks.core import Catalog, ControlAction, ControlRequest
from gateway.xiaozhi.ota.endpoint import OtaEndpoint

log = logging.getLogger(__name__)


class ResultsSource(Protocol):
    async def history(self, device: str, limit: int) -> list[InstanceRecord]:
        """The device's lessons, newest first."""
        ...

    async def lesson(self, instance_id: str) -> tuple[InstanceRecord, list[StepRecord]] | None: ...

    async def steps_done(self, instance_ids: list[str]) -> dict[str, int]:
        """Per lesson, how many of its steps the child finished (the progress plot's y)."""
        ...


@dataclass(frozen=True)
class StoreResults:
    store: Store

    async def history(self, device: str, limit: int) -> list[InstanceRecord]:
        return await self.store.list_instances(device_id=device, limit=limit)

    async def lesson(self, instance_id: str) -> tuple[InstanceRecord, list[StepRecord]] | None:
        return await self.store.get_instance(instance_id)

    async def steps_done(self, instance_ids: list[str]) -> dict[str, int]:
        if not instance_ids:
            return {}
        marks = ", ".join("?" for _ in instance_ids)
        sql = (
            "SELECT instance_id, COUNT(completed_ms) FROM steps "  # noqa: S608  # placeholders only
            f"WHERE instance_id IN ({marks}) GROUP BY instance_id"
        )
        rows = await self.store.call(lambda db: db.query(sql, instance_ids))
        return {str(iid): int(str(n)) for iid, n in rows}


class RecordingLinks(Protocol):
    def recording(self, instance_id: str, step_index: int) -> str | None:
        """A URL (signed, short-lived) of the child's recording of that step, if any."""
        ...

    def reference(self, app_id: str, task_id: str, lesson_id: str, clip: str) -> str | None: ...


class NoRecordings:
    def recording(self, instance_id: str, step_index: int) -> str | None:
        return None

    def reference(self, app_id: str, task_id: str, lesson_id: str, clip: str) -> str | None:
        return None


@dataclass(frozen=True, slots=True)
class LessonChoice:
    app_id: str
    task_id: str
    lesson_id: str
    title: str

    @property
    def key(self) -> str:
        return f"{self.app_id}/{self.task_id}/{self.lesson_id}"


def lesson_choices(catalog: Catalog) -> list[LessonChoice]:
    return sorted(
        (
            LessonChoice(t.app_id, t.task_id, lesson.lesson_id, t.title or t.task_id)
            for t in catalog
            for lesson in t.lessons
        ),
        key=lambda c: c.key,
    )


class LessonSteering(Protocol):
    def steer(
        self,
        device: str,
        action: ControlAction,
        *,
        priority: int,
        source: str,
        lesson: LessonChoice | None = None,
    ) -> bool:
        """Ask the task runtime; False when the request could not be queued."""
        ...


class ControlSink(Protocol):
    """The task inbox's control entry (:meth:`gateway.tasks.inbox.TaskInbox.put` is behind)."""

    def control(self, device: str, request: ControlRequest) -> None: ...


@dataclass
class InboxSteering:
    inbox: ControlSink

    def steer(
        self,
        device: str,
        action: ControlAction,
        *,
        priority: int,
        source: str,
        lesson: LessonChoice | None = None,
    ) -> bool:
        request = ControlRequest(
            action=action,
            request_id=f"console-{time.monotonic_ns():x}",
            app_id=lesson.app_id if lesson else None,
            task_id=lesson.task_id if lesson else None,
            lesson_id=lesson.lesson_id if lesson else None,
            priority=priority,
            source=source,
        )
        self.inbox.control(device, request)
        return True


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    device: str
    online: bool | None = None
    firmware: str | None = None
    rssi_dbm: int | None = None
    sd_free_bytes: int | None = None
    last_seen_ms: int | None = None
    alarms: tuple[str, ...] = ()


class FleetFacts(Protocol):
    def facts(self, device: str) -> DeviceFacts: ...


@dataclass(frozen=True)
class BoardFacts:
    """Online from the board channel, the device's recent ops alarms; nothing else yet."""

    is_online: Callable[[str], bool]
    alarms: Callable[[str], tuple[str, ...]] = lambda _device: ()

    def facts(self, device: str) -> DeviceFacts:
        return DeviceFacts(device, online=self.is_online(device), alarms=self.alarms(device))


@dataclass(frozen=True, slots=True)
class WaitingCode:
    code: str
    device: str
    expires_in_s: float


class ActivationApprovals(Protocol):
    enabled: bool

    def waiting(self) -> list[WaitingCode]: ...

    def devices(self) -> Iterable[str]:
        """Devices bound through OTA (the fleet's rows beside the granted ones)."""
        ...

    async def approve(self, code: str) -> tuple[bool, str]:
        """(approved, outcome: approved | unknown | locked | unsaved)."""
        ...


class OtaApprovals:
    def __init__(self, ota: OtaEndpoint | None) -> None:
        self._ota = ota
        self.enabled = ota is not None

    def waiting(self) -> list[WaitingCode]:
        if self._ota is None:
            return []
        now = self._ota.clock()
        return [
            WaitingCode(p.code, p.dev, round(p.expires - now, 1))
            for p in self._ota.book.pending(now)
        ]

    def devices(self) -> Iterable[str]:
        return [] if self._ota is None else sorted(self._ota.book.bindings)

    async def approve(self, code: str) -> tuple[bool, str]:
        if self._ota is None:
            return False, "unknown"
        outcome, pending = self._ota.book.approve(code, self._ota.clock())
        self._ota.stats.approvals.labels(outcome.value).inc()
        if pending is None:
            return False, outcome.value
        try:
            await self._ota.persist()
        except Exception:
            log.exception("saving OTA bindings failed")
            return True, "unsaved"
        log.info("console: %s approved for a new Client-Id", pending.dev)
        return True, outcome.value
