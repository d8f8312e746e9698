"""``BoardChannel``: the asyncio shell of the snlp/v1 board channel.

It routes ``snlp/v1/+/ack|rpt|evt|hb|status``, keeps one :class:`Device` (outbox + presence)
per board first seen with a valid id (at most ``max_devices``, least recently heard first; a
full table forgets an idle board, else a quiet one — see ``_evict_one`` — and only when every
board has commands pending are messages counted drops and commands ended ``overflow``), publishes commands QoS 1 on ``snlp/v1/{dev}/cmd``
and runs ONE timer task for the whole channel that sleeps until the earliest deadline of the
cores. Handlers only parse and update state; nothing here awaits the network.

The runtime receives typed events and presence changes through a :class:`BoardEventSink`
(called on the loop; it must only record or enqueue) and awaits command outcomes through
futures (:meth:`send`, :meth:`ensure_app_dirs`, :meth:`download`).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from gateway import labels
from gateway.board import wire
from gateway.board.device import Device, DownloadInFlight, ProgressCallback
from gateway.board.metrics import BoardMetrics
from gateway.board.model import (
    BoardAck,
    BoardEvent,
    BoardHeartbeat,
    BoardReport,
    Envelope,
    OnlineStatus,
    Outcome,
    OutcomeKind,
    PresenceChange,
)
from gateway.board.outbox import OutboxEffect, Send
from gateway.board.outputs import Alarms, BoardOutputs
from gateway.board.presence import Flapping, PresenceEffect
from gateway.metrics import Metrics
from gateway.mqtt import Handler, Inbound, Publisher
from gateway.settings import BoardSettings
from topics.errors import PayloadError, TopicError, excerpt
from topics.snlp_commands import CommandParams, EnsureAppDirs, Priority, TaskVerb
from topics.snlp_commands import Download as DownloadParams
from topics.tree import TopicKind, parse_topic, validate_device_id

if TYPE_CHECKING:
    from gateway.service import Context

log = logging.getLogger(__name__)

UPLINK_KINDS = (TopicKind.ACK, TopicKind.RPT, TopicKind.EVT, TopicKind.HB, TopicKind.STATUS)


class BoardEventSink(Protocol):
    """What the runtime implements to hear from boards; called on the loop, must not block."""

    def board_event(self, event: BoardEvent) -> None: ...

    def presence_changed(self, change: PresenceChange) -> None: ...


class Router(Protocol):
    def route(self, topic_filter: str, handler: Handler, *, qos: int = 1) -> None: ...


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class BoardChannel:
    name = "board"

    def __init__(
        self,
        *,
        settings: BoardSettings,
        sink: BoardEventSink | None = None,
        max_devices: int = 10_000,
        max_payload_bytes: int = 8192,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = _wall_ms,
    ) -> None:
        self.settings = settings
        self.sink = sink
        self._max_devices = max_devices
        self._max_payload = max_payload_bytes
        self._clock = clock
        self._wall_ms = wall_ms
        self._devices: dict[str, Device] = {}  # bounded by max_devices
        self._deadlines: dict[str, float] = {}  # each board's next deadline (one per board)
        # The same deadlines as a min-heap, stale entries skipped lazily (compacted when they
        # outnumber the live ones), so a tick costs what is due, not a scan of every board.
        self._heap: list[tuple[float, str]] = []
        self._wake = asyncio.Event()
        # What the timer sleeps until: only an earlier deadline wakes it (a scan of every
        # board per message would make a flood of new ids quadratic).
        self._sleep_until = float("inf")
        self._online_count = 0  # kept in step, so a presence change costs O(1)
        self._out: BoardOutputs | None = None
        # Scale-out: whether this gateway owns a device (gateway.cluster). Every gateway tracks
        # every board's presence (a new owner needs it at once); only the owner handles acks,
        # reports and events, sends commands and writes presence outputs.
        self.owns: Callable[[str], bool] = lambda _dev: True

    # -- wiring ----------------------------------------------------------------------------

    def attach(self, ctx: Context) -> None:
        self.bind(router=ctx.mqtt, publisher=ctx.mqtt, metrics=ctx.metrics, alarms=ctx.ops)

    def bind(
        self, *, router: Router, publisher: Publisher, metrics: Metrics, alarms: Alarms
    ) -> None:
        """What ``attach`` does, with the edges given one by one (shell tests pass fakes)."""
        self._out = BoardOutputs(
            publisher=publisher,
            alarms=alarms,
            metrics=BoardMetrics.create(metrics),
            wall_ms=self._wall_ms,
        )
        for kind in UPLINK_KINDS:
            router.route(f"snlp/v1/+/{kind.value}", self.handle, qos=1)

    @property
    def out(self) -> BoardOutputs:
        if self._out is None:
            raise RuntimeError("BoardChannel used before attach()/bind()")
        return self._out

    @property
    def m(self) -> BoardMetrics:
        return self.out.m

    async def run(self) -> None:
        """The channel's one timer: sleep until the earliest deadline of any board."""
        try:
            while True:
                self._wake.clear()
                self.tick()
                earliest = self._earliest()
                self._sleep_until = float("inf") if earliest is None else earliest
                delay = None if earliest is None else max(0.0, earliest - self._clock())
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
        finally:
            for device in self._devices.values():
                self._apply(device, device.outbox.cancel_all())

    # -- API for the runtime ---------------------------------------------------------------

    def is_online(self, dev: str) -> bool:
        device = self._devices.get(dev)
        return device is not None and device.presence.online

    def send(
        self,
        dev: str,
        params: CommandParams,
        *,
        prio: Priority = 2,
        ttl_ms: int | None = None,
        task_verb: TaskVerb | None = None,
        command_id: str | None = None,
    ) -> asyncio.Future[Outcome]:
        """Queue a command for ``dev``; the future resolves with its :class:`Outcome`.

        ``command_id`` (default: a fresh uuid) is the envelope id that acks and events ref.
        Raises ``TopicError`` for an invalid device id, pydantic's ``ValidationError`` for
        params the contract refuses and ``ValueError`` for an id already pending (caller
        bugs, not board input).
        """
        validate_device_id(dev)
        envelope = wire.build_command(
            params,
            id=command_id or uuid.uuid4().hex,
            ts_ms=self._wall_ms(),
            prio=prio,
            ttl_ms=self._ttl(ttl_ms),
            task_verb=task_verb,
        )
        return self._submit(dev, envelope)

    def submit(
        self,
        dev: str,
        cmd: str,
        params: Mapping[str, object],
        *,
        command_id: str | None = None,
        prio: int = 2,
        ttl_ms: int | None = None,
    ) -> asyncio.Future[Outcome]:
        """:meth:`send` for a command given as name + plain params (the runtime's effects);
        params the contract refuses raise ``topics.errors.PayloadError``."""
        validate_device_id(dev)
        envelope = wire.build_command_from_mapping(
            cmd,
            params,
            id=command_id or uuid.uuid4().hex,
            ts_ms=self._wall_ms(),
            prio=prio,
            ttl_ms=self._ttl(ttl_ms),
        )
        return self._submit(dev, envelope)

    def _ttl(self, ttl_ms: int | None) -> int:
        return ttl_ms if ttl_ms is not None else self.settings.default_ttl_ms

    def _submit(self, dev: str, envelope: Envelope) -> asyncio.Future[Outcome]:
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        device = self._device(dev)
        if device is None:  # the device table is full of busy boards
            outcome = Outcome(envelope.id, envelope.name, OutcomeKind.OVERFLOW, 0)
            self.out.outcome(dev, outcome)
            future.set_result(outcome)
            return future
        if envelope.id in device.futures:
            raise ValueError(f"command id {envelope.id!r} is already pending for {dev}")
        device.futures[envelope.id] = future
        self._apply(device, device.outbox.submit(envelope, self._clock()))
        return future

    async def ensure_app_dirs(
        self, dev: str, app: str, dirs: Sequence[str] = (), *, prio: Priority = 2
    ) -> Outcome:
        """Send ENSURE_APP_DIRS once per (board session, app); later callers share the outcome.

        Remembered only when delivered; forgotten when the board reboots or reconnects.
        """
        return await asyncio.shield(self.request_app_dirs(dev, app, dirs, prio=prio))

    def request_app_dirs(
        self, dev: str, app: str, dirs: Sequence[str] = (), *, prio: Priority = 2
    ) -> asyncio.Future[Outcome]:
        """:meth:`ensure_app_dirs` without waiting: queued now, so it precedes what follows."""
        validate_device_id(dev)
        device = self._device(dev)
        future = None if device is None else device.ensured.get(app)
        if future is None or (future.done() and not future.result().delivered):
            future = self.send(dev, EnsureAppDirs(app=app, dirs=list(dirs)), prio=prio)
            if device is not None:
                device.ensured[app] = future
        return future

    def download(
        self,
        dev: str,
        params: DownloadParams,
        *,
        on_progress: ProgressCallback | None = None,
        prio: Priority = 2,
        ttl_ms: int | None = None,
    ) -> DownloadInFlight:
        """Send DOWNLOAD; ``result`` resolves with the final report (``ok``, ``code``, bytes,
        sha256), or a synthesised failed one (code ``not_delivered:<outcome>`` or
        ``board_offline``) when the board never took it or dropped off mid-way."""
        validate_device_id(dev)
        envelope = wire.build_command(
            params, id=uuid.uuid4().hex, ts_ms=self._wall_ms(), prio=prio, ttl_ms=self._ttl(ttl_ms)
        )
        result: asyncio.Future[BoardReport] = asyncio.get_running_loop().create_future()
        acked = self._submit(dev, envelope)
        download = DownloadInFlight(envelope.id, acked, result, on_progress)
        device = self._devices.get(dev)
        if device is not None and not acked.done():
            device.downloads[envelope.id] = download
        acked.add_done_callback(lambda f: self._download_acked(dev, download, f.result()))
        return download

    def _download_acked(self, dev: str, download: DownloadInFlight, outcome: Outcome) -> None:
        if outcome.delivered or download.result.done():
            return
        device = self._devices.get(dev)
        if device is not None:
            device.downloads.pop(download.id, None)
        code = f"not_delivered:{outcome.kind.value}"
        download.result.set_result(BoardReport(outcome.id, "DOWNLOAD", "done", ok=False, code=code))

    # -- inbound ---------------------------------------------------------------------------

    def handle(self, msg: Inbound) -> None:
        """Route handler for every board uplink topic; never raises for bad input."""
        try:
            topic = parse_topic(msg.topic)
        except TopicError as exc:
            self._drop("unknown", "bad_topic", msg, exc)
            return
        if topic.kind not in UPLINK_KINDS or topic.dev is None:
            self._drop(topic.kind.value, "not_uplink", msg, None)
            return
        if msg.retain and topic.kind is not TopicKind.STATUS:
            # A retained ack/rpt/evt/hb would be replayed at every (re)subscribe; only the
            # retained status means something (presence, SPEC §3).
            self._drop(topic.kind.value, "retained", msg, None)
            return
        try:
            parsed = wire.parse(topic.kind, msg.payload, max_bytes=self._max_payload)
        except PayloadError as exc:
            self._drop(topic.kind.value, exc.reason.value, msg, exc)
            return
        device = self._device(topic.dev)
        if device is None:
            self._drop(topic.kind.value, "too_many_devices", msg, None)
            return
        now = self._clock()
        if not isinstance(parsed, OnlineStatus | BoardHeartbeat) and not self.owns(device.dev):
            self._presence(device, device.presence.on_activity(now))
            self.m.dropped.labels(topic.kind.value, "not_owner").inc()  # normal: counted only
            self._reschedule(device)
            return
        match parsed:
            case OnlineStatus():
                self._on_status(device, parsed, now)
            case BoardHeartbeat():
                if device.note_uptime(parsed.up_ms):
                    device.new_session()
                self._presence(device, device.presence.on_heartbeat(now))
            case BoardAck():  # resolve first: a board coming back must not get a needless resend
                self._on_ack(device, parsed, now)
                self._presence(device, device.presence.on_activity(now))
            case BoardReport():
                self._presence(device, device.presence.on_activity(now))
                self._on_report(device, parsed)
            case _:
                self._presence(device, device.presence.on_activity(now))
                self._on_event(device, parsed, msg)
        self._reschedule(device)

    def _on_status(self, device: Device, status: OnlineStatus, now: float) -> None:
        if not status.by_gateway and device.note_session(status.session):
            device.new_session()
        self._presence(device, device.presence.on_status(status, now))

    def _on_ack(self, device: Device, ack: BoardAck, now: float) -> None:
        effects = device.outbox.on_ack(ack, now)
        if effects is None:
            self.m.unmatched.labels("ack").inc()
            log.info("board %s: ack for no pending command %s", device.dev, excerpt(ack.ref, 40))
            return
        self._apply(device, effects)

    def _on_report(self, device: Device, report: BoardReport) -> None:
        m_cmd = labels.bounded(report.cmd, labels.COMMANDS)
        self.m.reports.labels(m_cmd, labels.bounded(report.stage, labels.REPORT_STAGES)).inc()
        download = device.downloads.get(report.ref)
        if download is None:
            self.m.unmatched.labels("rpt").inc()
            return
        if not report.final:
            if download.on_progress is not None:
                download.on_progress(report)
            return
        del device.downloads[report.ref]
        if not download.result.done():
            download.result.set_result(report)

    def _on_event(self, device: Device, parsed: wire.ParsedEvent, msg: Inbound) -> None:
        evt = getattr(parsed.body, "kind", None) or getattr(parsed.body, "evt", "button")
        self.m.events.labels(
            labels.board_event(evt), "legacy" if parsed.legacy else "structured"
        ).inc()
        event = BoardEvent(
            dev=device.dev,
            body=parsed.body,
            ref=parsed.ref,
            id=parsed.id,
            board_ts_ms=parsed.ts_ms,
            received_ms=msg.received_ms,
            received_mono=msg.received_mono,
            legacy=parsed.legacy,
        )
        if self.sink is not None:
            self.sink.board_event(event)

    def _drop(self, kind: str, reason: str, msg: Inbound, exc: Exception | None) -> None:
        self.out.dropped(kind, reason, msg, exc)

    # -- cores → effects -------------------------------------------------------------------

    def _device(self, dev: str) -> Device | None:
        device = self._devices.pop(dev, None)
        if device is None:
            if len(self._devices) >= self._max_devices and not self._evict_one():
                return None
            device = Device.create(dev, self.settings)
            self._devices[dev] = device
            self.m.tracked.set(len(self._devices))
            return device
        self._devices[dev] = device  # (re)inserted last: the table is least recently used first
        return device

    def _evict_one(self) -> bool:
        """Make room: forget the least recently heard board that is offline with nothing
        pending, else the least recently heard one with nothing pending even if online (fake
        ids that sent one heartbeat must not lock real boards out). Boards with commands in
        flight are never forgotten; with only those, the new board is refused (counted)."""
        for evictable in (Device.idle, Device.quiet):
            for dev, device in self._devices.items():
                if evictable(device):
                    if device.counted_online:
                        self._online_count -= 1
                    del self._devices[dev]
                    self._deadlines.pop(dev, None)
                    self.m.evicted.inc()
                    return True
        return False

    def tick(self) -> None:
        """Run every core whose deadline has come (the timer task calls this)."""
        now = self._clock()
        due: list[str] = []
        heap, deadlines = self._heap, self._deadlines
        while heap and heap[0][0] <= now:
            at, dev = heapq.heappop(heap)
            if deadlines.get(dev) == at and (not due or due[-1] != dev):
                due.append(dev)
        for dev in due:
            device = self._devices.get(dev)
            if device is None or deadlines.get(dev, now + 1) > now:
                continue  # forgotten, or rescheduled by a board handled earlier in this tick
            self._presence(device, device.presence.tick(now))
            self._apply(device, device.outbox.tick(now))
            self._reschedule(device)

    def _earliest(self) -> float | None:
        heap, deadlines = self._heap, self._deadlines
        while heap and deadlines.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # stale: the board's deadline moved or it was forgotten
        return heap[0][0] if heap else None

    def _reschedule(self, device: Device) -> None:
        deadline = device.next_deadline()
        if deadline is None:
            self._deadlines.pop(device.dev, None)
        else:
            if deadline < self._sleep_until:
                self._sleep_until = deadline
                self._wake.set()
            if self._deadlines.get(device.dev) != deadline:
                self._deadlines[device.dev] = deadline
                heapq.heappush(self._heap, (deadline, device.dev))
                if len(self._heap) > 4 * len(self._deadlines) + 64:
                    self._heap = [(at, dev) for dev, at in self._deadlines.items()]
                    heapq.heapify(self._heap)

    def _apply(self, device: Device, effects: list[OutboxEffect]) -> None:
        for effect in effects:
            if isinstance(effect, Send):
                self.out.command(
                    device.dev,
                    effect.envelope,
                    resend=effect.resend,
                    on_sent=self._on_sent(device.dev, effect.envelope.id, effect.sends),
                )
            else:
                self._done(device, effect.envelope, effect.outcome)
        self._reschedule(device)

    def _on_sent(self, dev: str, command_id: str, sends: int) -> Callable[[], None]:
        def sent() -> None:  # the publish left the gateway: its ack deadline starts now
            device = self._devices.get(dev)
            if device is not None and device.outbox.written(command_id, sends, self._clock()):
                self._reschedule(device)

        return sent

    def _done(self, device: Device, envelope: Envelope, outcome: Outcome) -> None:
        self.out.outcome(device.dev, outcome)
        future = device.futures.pop(envelope.id, None)
        if future is not None and not future.done():
            future.set_result(outcome)

    def _presence(self, device: Device, effects: list[PresenceEffect]) -> None:
        for effect in effects:
            if isinstance(effect, Flapping):
                if self.owns(device.dev):
                    self.out.flapping(effect)
            else:
                self._on_presence_change(device, effect, online=effect.online, reason=effect.reason)

    def _on_presence_change(
        self, device: Device, change: PresenceChange, *, online: bool, reason: str
    ) -> None:
        if online != device.counted_online:
            self._online_count += 1 if online else -1
            device.counted_online = online
        if self.owns(device.dev):
            self.out.presence(
                device.dev, online=online, reason=reason, online_count=self._online_count
            )
        if online:
            device.new_session()
        else:
            device.up_ms = None
            self._fail_downloads(device, "board_offline")
        self._apply(device, device.outbox.set_online(online, change.at_mono))
        if self.sink is not None:
            self.sink.presence_changed(change)

    def release_unowned(self) -> None:
        """Ownership moved (cluster listener): end the pending commands of boards owned
        elsewhere now, so this gateway sends them nothing more (no resend, no late command)."""
        for dev, device in self._devices.items():
            if not self.owns(dev):
                self._fail_downloads(device, "not_owner")
                self._apply(device, device.outbox.cancel_all())

    def _fail_downloads(self, device: Device, code: str) -> None:
        for download in device.downloads.values():
            if not download.result.done():
                download.result.set_result(
                    BoardReport(download.id, "DOWNLOAD", "done", ok=False, code=code)
                )
        device.downloads.clear()
