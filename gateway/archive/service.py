"""The learning record's audio archive: each lesson step's answer, as the device sent it.

Flow: the Xiaozhi pipeline keeps a session's recent Opus packets (bounded) and hands an
utterance's packets with its PCM; the task actor, when it submits that utterance for its step,
also calls :meth:`AnswerArchive.submit` — O(1), never blocks, never raises: the answer waits in
a bounded deque (``archive.queue_limit``; a full one drops the new answer, counted in
``archive_dropped`` and alarmed ``archive_overflow`` on the ops topic). One writer task muxes it
into Ogg Opus (:mod:`gateway.archive.ogg`, no re-encode), stores the blob (content-addressed,
:mod:`gateway.archive.blobs`) on the archive's own thread, records its row (``audio`` table)
and points the step row at it (``steps.audio_id``). CHAT turns never reach it.

Privacy (docs/privacy.md): a sweeper erases answers older than ``archive.retention_days``;
past ``archive.device_quota_mb`` a device's oldest answers go; :meth:`forget` erases a
device's audio, transcripts, metrics and rows. Audio is served only on the admin listener,
on a short-lived signed link (:mod:`gateway.archive.links`). Logs name ids and counts, never a
transcript or audio.

Read API (for re-assessment, results, the console): :meth:`get` (the Ogg bytes of an id),
:meth:`packets` (its Opus packets back, decodable with ``codec.opus``), :meth:`audio_of_step`,
:meth:`link` (a signed URL).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import secrets
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.archive.blobs import AudioBlobs, BlobMissing, content_id
from gateway.archive.links import (
    AUDIO_PATH,
    LinkCheck,
    SignedAudioLink,
    check_audio_link,
    sign_audio_link,
)
from gateway.archive.ogg import demux_ogg_opus, mux_ogg_opus, opus_duration_ms
from gateway.archive.retention import QuotaLedger, over_quota, retention_cutoff_ms
from gateway.http import RouteTable
from gateway.metrics import Metrics
from gateway.openapi import QueryParam, RouteDoc
from gateway.settings import ArchiveSettings
from gateway.store import Store, StoreError
from gateway.store.alarms import AlarmFn, RateLimitedAlarm, no_alarm
from gateway.store.records import ArchivedAudio, StepRecord
from gateway.store.store import wall_ms

log = logging.getLogger(__name__)
T = TypeVar("T")
SWEEP_BATCH = 500
_DEV_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"


@dataclass(frozen=True, slots=True)
class AnswerToArchive:
    device: str
    instance_id: str
    step_index: int
    packets: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class ForgetReport:
    instances: int
    steps: int
    audio: int
    blobs: int
    queued: int  # answers still waiting to be written, dropped

    def to_json(self) -> dict[str, int]:
        return {
            "instances": self.instances,
            "steps": self.steps,
            "audio": self.audio,
            "blobs": self.blobs,
            "queued": self.queued,
        }


class AudioLinkRequest(BaseModel):
    """The step whose archived answer to link."""

    model_config = ConfigDict(extra="forbid")

    instance_id: str = Field(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")
    step_index: int = Field(ge=0)


class AudioLinkAnswer(BaseModel):
    """A signed link to one archived answer (GET it on the admin listener before it expires)."""

    audio_id: str
    url: str
    expires_ms: int
    duration_ms: int
    created_ms: int


class ForgetAnswer(BaseModel):
    """What was erased for the device."""

    instances: int
    steps: int
    audio: int
    blobs: int
    queued: int


_DOCS = {
    "link": RouteDoc(
        summary="A short-lived signed link to a step's archived answer (Ogg Opus)",
        tag="learning record",
        body=AudioLinkRequest,
        response=AudioLinkAnswer,
        errors=(400, 404, 503),
    ),
    "audio": RouteDoc(
        summary="An archived answer (Ogg Opus), on a signed link only",
        tag="learning record",
        query=(
            QueryParam("expires", "Link expiry (epoch ms), from the link", required=True),
            QueryParam("sig", "Link signature (HMAC-SHA256), from the link", required=True),
        ),
        content_type="audio/ogg",
        errors=(403, 404, 503),
        bearer=False,  # the link's signature is the credential: a browser's <audio> can play it
    ),
    "forget": RouteDoc(
        summary="Erase a device's learning record: audio, transcripts, metrics, store rows",
        tag="learning record",
        response=ForgetAnswer,
        errors=(400, 503),
    ),
}


def _error(status: int, code: str, detail: str) -> web.Response:
    return web.json_response({"error": code, "detail": detail}, status=status)


class AnswerArchive:
    name = "archive"

    def __init__(
        self,
        *,
        settings: ArchiveSettings,
        store: Store,
        blobs: AudioBlobs,
        metrics: Metrics | None = None,
        alarm: AlarmFn = no_alarm,
        admin: RouteTable | None = None,
        clock_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.settings = settings
        self.blobs = blobs
        self._store = store
        self._clock_ms = clock_ms
        self._key = (
            settings.link_secret.get_secret_value().encode()
            if settings.link_secret is not None
            else secrets.token_bytes(32)
        )
        # Bounded: queue_limit answers; a new one past it is dropped, counted and alarmed.
        self._queue: deque[AnswerToArchive] = deque()
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._lock = asyncio.Lock()  # one writer, sweeper or forget at a time
        self._quota = QuotaLedger()  # the quota check without a sum per answer
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="archive")
        metrics = metrics or Metrics()
        self._written = metrics.counter("archive_written", "Answers archived (Ogg Opus)")
        self._bytes = metrics.counter("archive_bytes", "Bytes of Ogg Opus archived")
        self._dropped = metrics.counter(
            "archive_dropped", "Answers not archived: queue full", ["reason"]
        )
        self._failures = metrics.counter("archive_failures", "Answers whose archiving failed")
        self._erased = metrics.counter("archive_erased", "Archived answers erased", ["reason"])
        self._depth = metrics.gauge("archive_queue_depth", "Answers waiting to be archived")
        self._depth.set_function(lambda: len(self._queue))
        self._alarm_overflow = RateLimitedAlarm("archive_overflow", alarm, interval_s=60.0)
        self._alarm_failed = RateLimitedAlarm("archive_failed", alarm, interval_s=60.0)
        if admin is not None:
            admin.add_route("POST", "/admin/audio/links", self._link_route, _DOCS["link"])
            admin.add_route("GET", AUDIO_PATH, self._audio_route, _DOCS["audio"])
            admin.add_route("DELETE", "/admin/records/{dev}", self._forget_route, _DOCS["forget"])

    # ---- the hot path ---------------------------------------------------------------------------

    def submit(
        self, *, device: str, instance_id: str, step_index: int, packets: Sequence[bytes]
    ) -> None:
        """Queue a step's answer (its Opus packets) for archiving; O(1), never raises."""
        if not packets:
            self._dropped.labels("no_audio").inc()
            return
        if len(self._queue) >= self.settings.queue_limit:
            self._dropped.labels("queue_full").inc()
            self._alarm_overflow(limit=self.settings.queue_limit)
            return
        self._queue.append(AnswerToArchive(device, instance_id, step_index, tuple(packets)))
        self._idle.clear()
        self._wakeup.set()

    # ---- reads -------------------------------------------------------------------------------

    async def get(self, audio_id: str) -> bytes:
        """The Ogg Opus file of ``audio_id`` (:class:`BlobMissing` if not kept)."""
        return await self._on_thread(lambda: self.blobs.get(audio_id))

    async def packets(self, audio_id: str) -> tuple[bytes, ...]:
        """The device's Opus packets of ``audio_id``, as it sent them (16 kHz mono, 60 ms)."""
        return demux_ogg_opus(await self.get(audio_id)).packets

    async def audio_of_step(self, instance_id: str, step_index: int) -> ArchivedAudio | None:
        return await self._store.audio_of_step(instance_id, step_index)

    def link(self, audio_id: str, *, now_ms: int | None = None) -> SignedAudioLink:
        """A signed link to ``audio_id``, valid ``archive.link_ttl_s`` from now."""
        now = self._clock_ms() if now_ms is None else now_ms
        return sign_audio_link(self._key, audio_id, now_ms=now, ttl_s=self.settings.link_ttl_s)

    async def drained(self) -> None:
        """Wait until every answer submitted so far is archived (or failed)."""
        await self._idle.wait()

    # ---- erasure -----------------------------------------------------------------------------

    async def forget(self, device: str) -> ForgetReport:
        """Erase everything kept of ``device``: queued answers, blobs, audio rows, steps
        (transcripts, metrics) and instances. Raises StoreError (blobs stay listed then)."""
        async with self._lock:
            before = len(self._queue)
            self._queue = deque(a for a in self._queue if a.device != device)
            queued = before - len(self._queue)
            rows = await self._store.audio_of_device(device)
            for row in rows:
                await self._on_thread(functools.partial(self.blobs.delete, row.audio_id))
            instances, steps, audio = await self._store.forget_device(device)
            self._quota.forget(device)
        self._erased.labels("forget").inc(len(rows))
        log.info(
            "forgot device %s: %d instances, %d steps, %d answers", device, instances, steps, audio
        )
        return ForgetReport(instances, steps, audio, len(rows), queued)

    async def sweep(self, now_ms: int) -> int:
        """Erase every answer past retention at ``now_ms``; returns how many."""
        cutoff = retention_cutoff_ms(now_ms, self.settings.retention_days)
        erased = 0
        async with self._lock:
            while True:
                rows = await self._store.audio_before(cutoff, SWEEP_BATCH)
                await self._erase([r.audio_id for r in rows], "retention")
                erased += len(rows)
                if len(rows) < SWEEP_BATCH:
                    break
        if erased:
            log.info("retention: erased %d answers", erased)
        return erased

    async def _erase(self, audio_ids: list[str], reason: str) -> None:
        if not audio_ids:
            return
        self._quota.forget()  # rare (retention, quota): every device's total is read again
        for audio_id in audio_ids:
            await self._on_thread(functools.partial(self.blobs.delete, audio_id))
        await self._store.delete_audio(audio_ids)
        self._erased.labels(reason).inc(len(audio_ids))

    # ---- the writer and the sweeper -----------------------------------------------------------

    async def run(self) -> None:
        try:
            try:
                await self._on_thread(self.blobs.prepare)
                log.info("archive on %s", self.blobs.where)
            except Exception as exc:  # S3 down at start: writes fail, counted, until it is back
                log.warning("archive on %s not ready: %s", self.blobs.where, type(exc).__name__)
                self._alarm_failed(error=type(exc).__name__, during="start")
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._write_loop())
                tg.create_task(self._sweep_loop())
        finally:
            self._executor.shutdown(wait=False)

    async def _write_loop(self) -> None:
        while True:
            if not self._queue:
                self._idle.set()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            answer = self._queue.popleft()
            try:
                async with self._lock:
                    await self._write(answer)
            except Exception as exc:  # a failed answer must never stop the writer
                self._failures.inc()
                log.warning(
                    "archiving %s step %d failed: %s",
                    answer.instance_id,
                    answer.step_index,
                    type(exc).__name__,
                )
                self._alarm_failed(error=type(exc).__name__, instance_id=answer.instance_id)

    async def _write(self, answer: AnswerToArchive) -> None:
        serial = zlib.crc32(f"{answer.instance_id}/{answer.step_index}".encode())

        def mux_and_put() -> tuple[str, int, int]:
            data = mux_ogg_opus(answer.packets, serial=serial)
            audio_id = content_id(data)
            self.blobs.put(audio_id, data)
            return audio_id, len(data), int(opus_duration_ms(answer.packets))

        audio_id, size, duration_ms = await self._on_thread(mux_and_put)
        row = ArchivedAudio(
            audio_id,
            answer.device,
            answer.instance_id,
            answer.step_index,
            self._clock_ms(),
            size,
            duration_ms,
        )
        await self._store.add_audio(row)
        self._store.submit_step(
            StepRecord(answer.instance_id, answer.step_index, audio_id=audio_id)
        )
        self._written.inc()
        self._bytes.inc(size)
        quota = int(self.settings.device_quota_mb * 1_000_000)
        total = self._quota.total(answer.device, row.created_ms)
        if total is None:  # unknown or stale: one indexed sum (this answer's row included)
            total = await self._store.audio_bytes(answer.device)
            self._quota.read(answer.device, total, row.created_ms)
        else:
            total += size
            self._quota.wrote(answer.device, size)
        if total > quota:  # the rows decide what goes (the ledger only says when to look)
            excess = over_quota(await self._store.audio_of_device(answer.device), quota)
            await self._erase(excess, "quota")
            self._quota.forget(answer.device)

    async def _sweep_loop(self) -> None:
        while True:
            try:
                await self.sweep(self._clock_ms())
            except Exception as exc:  # store or blob store down: next period again
                log.warning("retention sweep failed: %s", type(exc).__name__)
                self._alarm_failed(error=type(exc).__name__, during="retention")
            await asyncio.sleep(self.settings.sweep_interval_s)

    async def _on_thread(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    # ---- admin routes ------------------------------------------------------------------------

    async def _link_route(self, request: web.Request) -> web.Response:
        try:
            ask = AudioLinkRequest.model_validate_json(await request.read())
        except ValidationError as exc:
            return _error(400, "bad_request", f"{exc.error_count()} invalid fields")
        try:
            row = await self._store.audio_of_step(ask.instance_id, ask.step_index)
        except StoreError:
            return _error(503, "store_unavailable", "the store cannot be read")
        if row is None:
            return _error(404, "not_found", "no archived answer for that step")
        link = self.link(row.audio_id)
        answer = AudioLinkAnswer(
            audio_id=row.audio_id,
            url=link.url,
            expires_ms=link.expires_ms,
            duration_ms=row.duration_ms,
            created_ms=row.created_ms,
        )
        return web.json_response(answer.model_dump())

    async def _audio_route(self, request: web.Request) -> web.StreamResponse:
        audio_id = request.match_info["audio_id"]
        verdict = check_audio_link(
            self._key,
            audio_id,
            request.query.get("expires", ""),
            request.query.get("sig", ""),
            now_ms=self._clock_ms(),
        )
        if verdict is not LinkCheck.OK:
            return _error(403, verdict.value, "the link is invalid or expired")
        try:
            data = await self.get(audio_id)
        except BlobMissing:
            return _error(404, "not_found", "that answer is no longer kept")
        except Exception as exc:  # the blob store is down: the route answers, never crashes
            log.warning("archive read failed: %s", type(exc).__name__)
            return _error(503, "archive_unavailable", "the archive cannot be read")
        return web.Response(
            body=data,
            content_type="audio/ogg",
            headers={"Cache-Control": "private, no-store"},
        )

    async def _forget_route(self, request: web.Request) -> web.Response:
        dev = request.match_info["dev"]
        if not re.match(_DEV_PATTERN, dev):
            return _error(400, "bad_request", "device id: 1-128 of [A-Za-z0-9_.:-]")
        try:
            report = await self.forget(dev)
        except Exception as exc:  # store or blob store down: answered, never a crash
            log.warning("forgetting %s failed: %s", dev, type(exc).__name__)
            return _error(503, "store_unavailable", "erasure failed; run it again")
        return web.json_response(report.to_json())
