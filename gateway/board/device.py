"""One board as the channel tracks it: its outbox, its presence and its per-session memory."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.board.model import BoardHeartbeat, BoardReport, Outcome
from gateway.board.outbox import Outbox
from gateway.board.presence import PresenceTracker
from gateway.settings import BoardSettings

ProgressCallback = Callable[[BoardReport], None]


@dataclass(slots=True)
class DownloadInFlight:
    """A DOWNLOAD in progress: ``acked`` when the board takes it, ``result`` the final report."""

    id: str
    acked: asyncio.Future[Outcome]
    result: asyncio.Future[BoardReport]
    on_progress: ProgressCallback | None = None


@dataclass(slots=True)
class Device:
    dev: str
    outbox: Outbox
    presence: PresenceTracker
    futures: dict[str, asyncio.Future[Outcome]] = field(default_factory=dict)
    # ENSURE_APP_DIRS per app for the board's current session (cleared when it reconnects).
    ensured: dict[str, asyncio.Future[Outcome]] = field(default_factory=dict)
    downloads: dict[str, DownloadInFlight] = field(default_factory=dict)
    up_ms: int | None = None
    session: str | None = None
    # The last heartbeat's figures (fw, rssi, heap, sd_free_mb) and when it came (monotonic s):
    # served by the admin API (``GET /admin/boards/{dev}/status``), forgotten with the device.
    last_heartbeat: BoardHeartbeat | None = None
    heartbeat_at: float | None = None
    # Whether the channel's online count includes this board: a first-ever status may say
    # "offline" (UNKNOWN → OFFLINE), which must not take one off the count.
    counted_online: bool = False

    @classmethod
    def create(cls, dev: str, s: BoardSettings) -> Device:
        return cls(
            dev,
            Outbox(
                ack_timeout_s=s.ack_timeout_s,
                max_resends=s.max_resends,
                limit=s.outbox_limit,
                window=s.max_in_flight,
                backoff=s.resend_backoff,
                write_confirmed=True,  # the channel reports each publish's write
            ),
            PresenceTracker(
                dev,
                heartbeat_s=s.heartbeat_s,
                missed_heartbeats=s.missed_heartbeats,
                flap_window_s=s.flap_window_s,
                flap_threshold=s.flap_threshold,
            ),
        )

    def next_deadline(self) -> float | None:
        outbox, presence = self.outbox.next_deadline(), self.presence.next_deadline()
        if outbox is None or presence is None:
            return presence if outbox is None else outbox
        return min(outbox, presence)

    def idle(self) -> bool:
        """Offline (or never online) with nothing queued or awaited: safe to forget."""
        return not self.presence.online and self.quiet()

    def quiet(self) -> bool:
        """Nothing queued or awaited (it may be online): forgetting it loses no command; a
        board still alive is tracked again from its next message."""
        return (
            len(self.outbox) == 0
            and not self.futures
            and not self.downloads
            and all(f.done() for f in self.ensured.values())
        )

    def new_session(self) -> None:
        """The board rebooted or reconnected: forget what it was told in its last session."""
        self.ensured = {app: f for app, f in self.ensured.items() if not f.done()}

    def note_heartbeat(self, heartbeat: BoardHeartbeat, now: float) -> bool:
        """Keep the heartbeat's figures; True if the board rebooted (:meth:`note_uptime`)."""
        self.last_heartbeat = heartbeat
        self.heartbeat_at = now
        return self.note_uptime(heartbeat.up_ms)

    def note_uptime(self, up_ms: int | None) -> bool:
        """Record the heartbeat's uptime; True if it went backwards (the board rebooted)."""
        rebooted = up_ms is not None and self.up_ms is not None and up_ms < self.up_ms
        if up_ms is not None:
            self.up_ms = up_ms
        return rebooted

    def note_session(self, session: str | None) -> bool:
        changed = session is not None and self.session is not None and session != self.session
        if session is not None:
            self.session = session
        return changed
