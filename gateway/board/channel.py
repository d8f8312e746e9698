"""``BoardChannel``: the asyncio shell of the snlp/v1 board channel.

It routes ``snlp/v1/+/ack|rpt|evt|hb|status`` to :class:`~gateway.board.inbound.BoardUplink`,
keeps one :class:`Device` (outbox + presence) per board in a
:class:`~gateway.board.table.BoardTable` (bounded, see there), publishes commands QoS 1 on
``snlp/v1/{dev}/cmd`` and runs ONE timer task for the whole channel that sleeps until the
earliest deadline of the cores. Nothing here awaits the network.

The runtime receives typed events and presence changes through the :class:`BoardEventSink` it
is built with (called on the loop; it must only record or enqueue) and awaits command outcomes
through futures (:meth:`send`, :meth:`ensure_app_dirs`, :meth:`download`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from gateway.board import wire
from gateway.board.admin import BoardStatusView
from gateway.board.device import DownloadInFlight, ProgressCallback
from gateway.board.inbound import UPLINK_KINDS, BoardUplink
from gateway.board.metrics import BoardMetrics
from gateway.board.model import BoardReport, Envelope, Outcome, OutcomeKind
from gateway.board.outputs import Alarms, BoardOutputs
from gateway.board.table import BoardEventSink, BoardTable
from gateway.metrics import Metrics
from gateway.mqtt.edge import Handler, Inbound, Publisher
from gateway.settings import BoardSettings
from topics.snlp_commands import CommandParams, Priority, TaskVerb
from topics.snlp_commands import Download as DownloadParams
from topics.tree import validate_device_id

__all__ = ["BoardChannel", "BoardEventSink", "Router"]


class Router(Protocol):
    def route(self, topic_filter: str, handler: Handler, *, qos: int = 1) -> None: ...


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _everyone(_dev: str) -> bool:
    return True


class BoardChannel:
    name = "board"

    def __init__(
        self,
        *,
        settings: BoardSettings,
        router: Router,
        publisher: Publisher,
        metrics: Metrics,
        alarms: Alarms,
        sink: BoardEventSink,
        owns: Callable[[str], bool] = _everyone,
        max_devices: int = 10_000,
        max_payload_bytes: int = 8192,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = _wall_ms,
    ) -> None:
        """``router``/``publisher``: the MQTT connection (shell tests pass fakes); ``owns``:
        whether this gateway acts for a device (scale-out; every board's presence is tracked
        either way)."""
        self.settings = settings
        self._clock = clock
        self._wall_ms = wall_ms
        self.out = BoardOutputs(
            publisher=publisher,
            alarms=alarms,
            metrics=BoardMetrics.create(metrics),
            wall_ms=wall_ms,
        )
        self.m = self.out.m
        self._table = BoardTable(
            settings=settings,
            out=self.out,
            sink=sink,
            owns=owns,
            max_devices=max_devices,
            clock=clock,
        )
        self._devices = self._table.devices
        self._uplink = BoardUplink(
            table=self._table, max_payload_bytes=max_payload_bytes, clock=clock
        )
        for kind in UPLINK_KINDS:
            router.route(f"snlp/v1/+/{kind.value}", self.handle, qos=1)

    def handle(self, msg: Inbound) -> None:
        """Route handler for every board uplink topic; never raises for bad input."""
        self._uplink.handle(msg)

    def tick(self) -> None:
        """Run every core whose deadline has come (the timer task calls this)."""
        self._table.tick()

    def release_unowned(self) -> None:
        """Ownership moved (cluster listener): end the pending commands of boards owned
        elsewhere now, so this gateway sends them nothing more (no resend, no late command)."""
        self._table.release_unowned()

    async def run(self) -> None:
        """The channel's one timer: sleep until the earliest deadline of any board."""
        table = self._table
        try:
            while True:
                table.wake.clear()
                table.tick()
                earliest = table.earliest()
                table.sleep_until = float("inf") if earliest is None else earliest
                delay = None if earliest is None else max(0.0, earliest - self._clock())
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await table.wake.wait()
        finally:
            table.cancel_all()

    # -- API for the runtime ---------------------------------------------------------------

    def status_of(self, dev: str) -> BoardStatusView | None:
        """What the channel knows of ``dev`` now (None: not tracked: never heard since the
        gateway started, or forgotten to make room for newer boards)."""
        device = self._devices.get(dev)
        if device is None:
            return None
        hb = device.last_heartbeat
        age = None if device.heartbeat_at is None else max(0.0, self._clock() - device.heartbeat_at)
        return BoardStatusView(
            device=dev,
            online=device.presence.online,
            fw=hb.fw if hb else None,
            rssi=hb.rssi if hb else None,
            heap=hb.heap if hb else None,
            sd_free_mb=hb.sd_free_mb if hb else None,
            up_ms=device.up_ms,
            heartbeat_age_s=None if age is None else round(age, 3),
        )

    def online_devices(self) -> list[str]:
        """The boards tracked and online now."""
        return [dev for dev, device in self._devices.items() if device.presence.online]

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
        device = self._table.device(dev)
        if device is None:  # the device table is full of busy boards
            outcome = Outcome(envelope.id, envelope.name, OutcomeKind.OVERFLOW, 0)
            self.out.outcome(dev, outcome)
            future.set_result(outcome)
            return future
        if envelope.id in device.futures:
            raise ValueError(f"command id {envelope.id!r} is already pending for {dev}")
        device.futures[envelope.id] = future
        self._table.apply(device, device.outbox.submit(envelope, self._clock()))
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
        device = self._table.device(dev)
        future = None if device is None else device.ensured.get(app)
        if future is None or (future.done() and not future.result().delivered):
            # As plain params: validated and encoded through the model once per distinct app
            # (topics.fastwire), not a model built per board session.
            future = self.submit(
                dev, "ENSURE_APP_DIRS", {"app": app, "dirs": list(dirs)}, prio=prio
            )
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
