"""The board channel's device table: one :class:`Device` (outbox + presence cores) per board,
the cores' deadlines, and what their effects do (publish, resolve futures, tell the runtime).

At most ``max_devices`` boards, least recently heard first; a full table forgets an idle board,
else a quiet one (see :meth:`BoardTable.evict_one`), and only when every board has commands
pending is the new board refused (the caller counts a drop or ends the command ``overflow``).
The channel's ONE timer task sleeps until :meth:`BoardTable.earliest` and calls :meth:`tick`.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Callable
from typing import Protocol

from gateway.board.device import Device
from gateway.board.model import BoardEvent, BoardReport, Envelope, Outcome, PresenceChange
from gateway.board.outbox import OutboxEffect, Send
from gateway.board.outputs import BoardOutputs
from gateway.board.presence import Flapping, PresenceEffect
from gateway.settings import BoardSettings

log = logging.getLogger(__name__)


class BoardEventSink(Protocol):
    """What the runtime implements to hear from boards; called on the loop, must not block."""

    def board_event(self, event: BoardEvent) -> None: ...

    def presence_changed(self, change: PresenceChange) -> None: ...


class BoardTable:
    def __init__(
        self,
        *,
        settings: BoardSettings,
        out: BoardOutputs,
        sink: BoardEventSink,
        owns: Callable[[str], bool],
        max_devices: int,
        clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.out = out
        self.sink = sink
        # Scale-out: whether this gateway owns a device (gateway.cluster). Every gateway tracks
        # every board's presence (a new owner needs it at once); only the owner handles acks,
        # reports and events, sends commands and writes presence outputs.
        self.owns = owns
        self._max_devices = max_devices
        self._clock = clock
        self.devices: dict[str, Device] = {}  # bounded by max_devices
        self._deadlines: dict[str, float] = {}  # each board's next deadline (one per board)
        # The same deadlines as a min-heap, stale entries skipped lazily (compacted when they
        # outnumber the live ones), so a tick costs what is due, not a scan of every board.
        self._heap: list[tuple[float, str]] = []
        self.wake = asyncio.Event()
        # What the timer sleeps until: only an earlier deadline wakes it (a scan of every
        # board per message would make a flood of new ids quadratic).
        self.sleep_until = float("inf")
        self._online_count = 0  # kept in step, so a presence change costs O(1)

    def earliest(self) -> float | None:
        heap, deadlines = self._heap, self._deadlines
        while heap and deadlines.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # stale: the board's deadline moved or it was forgotten
        return heap[0][0] if heap else None

    def device(self, dev: str) -> Device | None:
        """``dev``'s entry, made (and moved to most recently heard) now; ``None`` when the
        table is full of busy boards."""
        device = self.devices.pop(dev, None)
        if device is None:
            if len(self.devices) >= self._max_devices and not self.evict_one():
                return None
            device = Device.create(dev, self.settings)
            self.devices[dev] = device
            self.out.m.tracked.set(len(self.devices))
            return device
        self.devices[dev] = device  # (re)inserted last: the table is least recently used first
        return device

    def evict_one(self) -> bool:
        """Make room: forget the least recently heard board that is offline with nothing
        pending, else the least recently heard one with nothing pending even if online (fake
        ids that sent one heartbeat must not lock real boards out). Boards with commands in
        flight are never forgotten; with only those, the new board is refused (counted)."""
        for evictable in (Device.idle, Device.quiet):
            for dev, device in self.devices.items():
                if evictable(device):
                    if device.counted_online:
                        self._online_count -= 1
                    del self.devices[dev]
                    self._deadlines.pop(dev, None)
                    self.out.m.evicted.inc()
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
            device = self.devices.get(dev)
            if device is None or deadlines.get(dev, now + 1) > now:
                continue  # forgotten, or rescheduled by a board handled earlier in this tick
            self.presence(device, device.presence.tick(now))
            self.apply(device, device.outbox.tick(now), reschedule=False)
            self.reschedule(device)

    def reschedule(self, device: Device) -> None:
        deadline = device.next_deadline()
        if deadline is None:
            self._deadlines.pop(device.dev, None)
        else:
            if deadline < self.sleep_until:
                self.sleep_until = deadline
                self.wake.set()
            if self._deadlines.get(device.dev) != deadline:
                self._deadlines[device.dev] = deadline
                heapq.heappush(self._heap, (deadline, device.dev))
                if len(self._heap) > 4 * len(self._deadlines) + 64:
                    self._heap = [(at, dev) for dev, at in self._deadlines.items()]
                    heapq.heapify(self._heap)

    def apply(
        self, device: Device, effects: list[OutboxEffect], *, reschedule: bool = True
    ) -> None:
        """Perform the outbox's effects; ``reschedule=False``: the caller reschedules ``device``
        once when it is done with it (a board message's handler, the tick)."""
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
        if reschedule:
            self.reschedule(device)

    def _on_sent(self, dev: str, command_id: str, sends: int) -> Callable[[], None]:
        def sent() -> None:  # the publish left the gateway: its ack deadline starts now
            device = self.devices.get(dev)
            if device is not None and device.outbox.written(command_id, sends, self._clock()):
                self.reschedule(device)

        return sent

    def _done(self, device: Device, envelope: Envelope, outcome: Outcome) -> None:
        self.out.outcome(device.dev, outcome)
        future = device.futures.pop(envelope.id, None)
        if future is not None and not future.done():
            future.set_result(outcome)

    def presence(self, device: Device, effects: list[PresenceEffect]) -> None:
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
            self.fail_downloads(device, "board_offline")
        self.apply(device, device.outbox.set_online(online, change.at_mono))
        self.sink.presence_changed(change)

    def release_unowned(self) -> None:
        """Ownership moved (cluster listener): end the pending commands of boards owned
        elsewhere now, so this gateway sends them nothing more (no resend, no late command)."""
        for dev, device in self.devices.items():
            if not self.owns(dev):
                self.fail_downloads(device, "not_owner")
                self.apply(device, device.outbox.cancel_all())

    def cancel_all(self) -> None:
        """Shutdown: every pending command ends ``cancelled``."""
        for device in self.devices.values():
            self.apply(device, device.outbox.cancel_all())

    def fail_downloads(self, device: Device, code: str) -> None:
        for download in device.downloads.values():
            if not download.result.done():
                download.result.set_result(
                    BoardReport(download.id, "DOWNLOAD", "done", ok=False, code=code)
                )
        device.downloads.clear()
