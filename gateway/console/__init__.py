"""The web console for people: parents, teachers and operators (docs/console.md).

Served on its own listener (``http.console_host:console_port``, loopback by default), never on
the device listener boards reach, and not on the admin listener: that one answers machines
with a bearer token, this one people with password logins, sessions and CSRF tokens; each can
be exposed (or not) on its own.

Wiring (composition root)::

    console = build_console(ctx, store=..., inbox=..., catalog=..., online=..., ota=...)
    components.append(console)
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.console.accounts import AccountBook, AccountError, ConsoleRole
from gateway.console.alarms import RecentAlarms
from gateway.console.seams import (
    AnswerReader,
    ArchiveRecordings,
    BoardFacts,
    ControlSink,
    InboxSteering,
    LessonContent,
    LessonFiles,
    MediaContent,
    NoContent,
    NoRecordings,
    OtaApprovals,
    RecordingLinks,
    StatusFacts,
    StoreResults,
    SyncJobs,
    lesson_choices,
)
from gateway.console.web import ConsoleParts, ConsoleWeb, LiveHub
from gateway.http import HttpServer
from gateway.store.errors import StoreError
from gateway.store.store import Store
from gateway.tasks.core import Catalog

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.board.admin import BoardStatusView
    from gateway.service import Context
    from gateway.xiaozhi.ota.endpoint import OtaEndpoint
    from gateway.xiaozhi.status import DeviceStatus

log = logging.getLogger(__name__)

BOOTSTRAP_USER = "admin"
BOOTSTRAP_FILE = "console-bootstrap.txt"


class Console:
    """The console's listener; at start, the first operator account if there is none."""

    name = "console"

    def __init__(
        self, *, server: HttpServer, accounts: AccountBook, bootstrap: Path | None
    ) -> None:
        self.server = server
        self.accounts = accounts
        self._bootstrap = bootstrap

    async def run(self) -> None:
        if self._bootstrap is not None:
            await self._first_account(self._bootstrap)
        await self.server.run()

    async def _first_account(self, path: Path) -> None:
        try:
            if await self.accounts.count():
                return
            password = secrets.token_urlsafe(12)
            await self.accounts.add(BOOTSTRAP_USER, ConsoleRole.OPERATOR, password)
        except (StoreError, AccountError) as exc:  # AccountError: another gateway was first
            log.warning("console: no first account made (%s)", exc)
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(f"user: {BOOTSTRAP_USER}\npassword: {password}\n")
        except OSError as exc:
            log.warning(
                "console: first account %r made but %s not written (%s): set its password "
                "with `snlpgw user passwd %s`",
                BOOTSTRAP_USER,
                path,
                exc,
                BOOTSTRAP_USER,
            )
            return
        log.info(
            "console: first account %r made; its password is in %s (change it with "
            "`snlpgw user passwd %s`)",
            BOOTSTRAP_USER,
            path,
            BOOTSTRAP_USER,
        )


def build_console(
    ctx: Context,
    *,
    store: Store,
    inbox: ControlSink,
    catalog: Catalog,
    online: Callable[[str], bool],
    ota: OtaEndpoint | None,
    archive: AnswerReader | None = None,
    media: LessonFiles | None = None,
    sync: SyncJobs | None = None,
    board_status: Callable[[str], BoardStatusView | None] | None = None,
    xiaozhi_status: Callable[[str], DeviceStatus | None] | None = None,
    voice_online: Callable[[str], bool] = lambda _device: False,
) -> Console:
    settings = ctx.settings
    cs = settings.console
    server = HttpServer(
        host=settings.http.console_host,
        port=settings.http.console_port,
        metrics=ctx.metrics,
        name="HTTP (console)",
        serve_metrics=False,
        health=ctx.http.health_checks,
        health_details=False,
    )
    accounts = AccountBook(store, session_ttl_s=cs.session_hours * 3600)
    hub = LiveHub()
    recent = RecentAlarms()
    ctx.ops.listeners.append(recent.raised)
    store.add_listener(hub.committed)
    server.on_shutdown(hub.close)
    recordings: RecordingLinks = NoRecordings()
    if archive is not None:
        secret = settings.archive.link_secret
        recordings = ArchiveRecordings(
            archive,
            media,
            ttl_s=settings.archive.link_ttl_s,
            secret=secret.get_secret_value().encode() if secret is not None else None,
        )
    content: LessonContent = NoContent()
    if media is not None and sync is not None:
        content = MediaContent(media, sync, catalog)
    fleet = (
        StatusFacts(
            board_status,
            xiaozhi_status or (lambda _d: None),
            recent.of,
            voice_online=voice_online,
        )
        if board_status is not None
        else BoardFacts(online, recent.of)
    )
    parts = ConsoleParts(
        accounts=accounts,
        results=StoreResults(store),
        recordings=recordings,
        steering=InboxSteering(inbox),
        fleet=fleet,
        approvals=OtaApprovals(ota),
        content=content,
        lessons=lambda: lesson_choices(catalog),  # the live catalog, as it is now
        running=store.running_instances,
    )
    ConsoleWeb(
        parts,
        routes=server,
        hub=hub,
        login_failures=cs.login_failures,
        secure_cookies=cs.secure_cookies,
        timezone=cs.timezone,
    )
    bootstrap = settings.data_dir / BOOTSTRAP_FILE if cs.bootstrap else None
    return Console(server=server, accounts=accounts, bootstrap=bootstrap)
