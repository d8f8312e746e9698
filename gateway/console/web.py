"""The console's pages (aiohttp handlers, Jinja2 templates, vendored htmx), on its own listener.

Every page but ``/login``, ``/lang`` and ``/static`` needs a session; every POST needs the
session's CSRF token (a form field, or the ``X-CSRF-Token`` header htmx sends). A device page
(``/child/{dev}``, ``/steer/{dev}``, their exports and live events) answers 404 to a user not
given that device: the same answer as a device that does not exist, so a URL reveals nothing.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from importlib.resources import files
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import jinja2
from aiohttp import web

from gateway.console.accounts import (
    DEVICE_RE,
    AccountBook,
    ConsoleRole,
    ConsoleUser,
    DeviceGrant,
    LoggedIn,
    csrf_ok,
)
from gateway.console.i18n import LANGS, negotiate, text
from gateway.console.limiter import LoginLimiter
from gateway.console.plot import progress_svg
from gateway.console.seams import (
    ActivationApprovals,
    FleetFacts,
    LessonChoice,
    LessonContent,
    LessonSteering,
    RecordingLinks,
    ResultsSource,
)
from gateway.http import RouteTable
from gateway.store.errors import StoreError
from gateway.store.records import InstanceRecord, StepRecord
from gateway.store.results import run_signals
from gateway.tasks.core import ControlAction, PriorityLevel

log = logging.getLogger(__name__)

SESSION_COOKIE = "snlpgw_console"
LOGIN_CSRF_COOKIE = "snlpgw_login_csrf"
LANG_COOKIE = "lang"
HISTORY_LIMIT = 50
EXPORT_LIMIT = 50
MAX_LIVE = 64  # live-progress streams at once; more are refused 503
KEEPALIVE_S = 15.0
STATIC = {
    "htmx.min.js": "text/javascript",
    "htmx.LICENSE": "text/plain",
    "console.js": "text/javascript",
    "console.css": "text/css",
}
PRIORITY = {
    ConsoleRole.PARENT: PriorityLevel.PARENT,  # SPEC §5: a parent's request preempts all
    ConsoleRole.OPERATOR: PriorityLevel.PARENT,
    ConsoleRole.TEACHER: PriorityLevel.SCHEDULED,  # a class plan; never preempts a parent
}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "style-src 'self'; script-src 'self'; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

PageHandler = Callable[[web.Request, LoggedIn], Awaitable[web.StreamResponse]]


class LiveHub:
    """Wakes the live-progress streams when the store commits a row (a store listener)."""

    def __init__(self, limit: int = MAX_LIVE) -> None:
        self.limit = limit
        self.closed = False
        self._waiters: set[asyncio.Event] = set()

    def __len__(self) -> int:
        return len(self._waiters)

    def committed(self, _instance_id: str) -> None:
        for event in self._waiters:
            event.set()

    def close(self) -> None:
        """The server is shutting down: every stream ends at its next wake-up (now)."""
        self.closed = True
        for event in self._waiters:
            event.set()

    def join(self) -> asyncio.Event | None:
        if self.closed or len(self._waiters) >= self.limit:
            return None
        event = asyncio.Event()
        self._waiters.add(event)
        return event

    def leave(self, event: asyncio.Event) -> None:
        self._waiters.discard(event)


@dataclass(frozen=True)
class ConsoleParts:
    """What the pages use (the seams: :mod:`gateway.console.seams`)."""

    accounts: AccountBook
    results: ResultsSource
    recordings: RecordingLinks
    steering: LessonSteering
    fleet: FleetFacts
    approvals: ActivationApprovals
    content: LessonContent
    lessons: Callable[[], list[LessonChoice]]  # read per page: a catalog reload shows at once
    running: Callable[[], Awaitable[list[InstanceRecord]]]


class ConsoleWeb:
    def __init__(
        self,
        parts: ConsoleParts,
        *,
        routes: RouteTable,
        hub: LiveHub,
        login_failures: int = 5,
        secure_cookies: bool = False,
        timezone: str = "Asia/Shanghai",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._p = parts
        self._hub = hub
        self._limiter = LoginLimiter(max_failures=login_failures)
        self._secure = secure_cookies
        self._clock = clock
        try:
            self._tz: tzinfo = ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            log.warning("console: unknown timezone %r; times shown in UTC", timezone)
            self._tz = UTC
        self._env = jinja2.Environment(
            loader=jinja2.PackageLoader("gateway.console", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        add = routes.add_route
        add("GET", "/static/{name}", self.static)
        add("GET", "/login", self.login_page)
        add("POST", "/login", self.login)
        add("GET", "/lang", self.lang)
        add("POST", "/logout", self._authed(self.logout))
        add("GET", "/", self._authed(self.home))
        add("GET", "/child/{dev}", self._authed(self.child))
        add("GET", "/child/{dev}/lesson/{iid}", self._authed(self.lesson))
        add("GET", "/child/{dev}/audio/{audio_id}", self._authed(self.audio))
        add("GET", "/clip/{app_id}/{task_id}/{lesson_id}/{clip}", self._authed(self.clip))
        add("GET", "/child/{dev}/export.json", self._authed(self.export_json))
        add("GET", "/child/{dev}/export.csv", self._authed(self.export_csv))
        add("GET", "/steer/{dev}", self._authed(self.steer_page))
        add("POST", "/steer/{dev}", self._authed(self.steer))
        add("GET", "/steer/{dev}/events", self._authed(self.live_events))
        add("GET", "/fleet", self._authed(self.fleet))
        add("POST", "/fleet/approve", self._authed(self.approve))
        add("POST", "/fleet/sync", self._authed(self.sync))

    # ---- plumbing -----------------------------------------------------------------------------

    def _lang(self, request: web.Request) -> str:
        return negotiate(request.cookies.get(LANG_COOKIE), request.headers.get("Accept-Language"))

    def _render(
        self, request: web.Request, name: str, status: int = 200, **context: Any
    ) -> web.Response:
        lang = self._lang(request)
        body = self._env.get_template(name).render(
            t=lambda key: text(key, lang),
            lang=lang,
            langs=LANGS,
            path=request.path_qs,
            ms=_ms,
            **context,
        )
        return web.Response(
            text=body, status=status, content_type="text/html", charset="utf-8", headers=HEADERS
        )

    def _cookie(self, response: web.StreamResponse, request: web.Request, name: str, value: str,
                max_age: int | None = None) -> None:  # fmt: skip
        response.set_cookie(
            name,
            value,
            max_age=max_age,
            path="/",
            httponly=True,
            samesite="Strict",
            secure=self._secure or request.secure,
        )

    def _authed(
        self, handler: PageHandler
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def wrapped(request: web.Request) -> web.StreamResponse:
            token = request.cookies.get(SESSION_COOKIE, "")
            try:
                who = await self._p.accounts.session(token) if token else None
            except StoreError:
                return self._render(request, "error.html", 503, who=None, message="server_busy")
            if who is None:
                if request.method == "GET" and not request.path.endswith("/events"):
                    raise web.HTTPSeeOther(f"/login?next={_local(request.path)}")
                return web.Response(status=401, text="login required", headers=HEADERS)
            if request.method == "POST":
                form = await request.post()
                given = request.headers.get("X-CSRF-Token") or str(form.get("csrf", ""))
                if not csrf_ok(who.csrf, given):
                    return self._render(
                        request, "error.html", 403, who=who, message="forbidden_csrf"
                    )
            return await handler(request, who)

        return wrapped

    def _device(self, request: web.Request, who: LoggedIn) -> str:
        """The ``{dev}`` of the URL, or 404 when malformed or not this user's to see."""
        dev = request.match_info["dev"]
        if not DEVICE_RE.fullmatch(dev) or not who.user.may_see(dev):
            raise web.HTTPNotFound(
                text=self._render(request, "error.html", who=None, message="not_found").text,
                content_type="text/html",
                headers=HEADERS,
            )
        return dev

    def _when(self, ms: int | None) -> str:
        if ms is None:
            return "—"
        return datetime.fromtimestamp(ms / 1000, self._tz).strftime("%Y-%m-%d %H:%M")

    def _label(self, user: ConsoleUser, dev: str) -> str:
        return next((g.label for g in user.grants if g.device == dev and g.label), dev)

    # ---- public pages -------------------------------------------------------------------------

    async def static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in STATIC:
            raise web.HTTPNotFound()
        body = (files("gateway.console") / "static" / name).read_bytes()
        return web.Response(
            body=body,
            content_type=STATIC[name],
            charset="utf-8",
            headers={"Cache-Control": "max-age=3600", "X-Content-Type-Options": "nosniff"},
        )

    async def login_page(self, request: web.Request) -> web.StreamResponse:
        return self._login_form(request, error=None)

    def _login_form(
        self, request: web.Request, *, error: str | None, status: int = 200
    ) -> web.Response:
        csrf = secrets.token_urlsafe(24)
        response = self._render(
            request,
            "login.html",
            status,
            who=None,
            csrf=csrf,
            error=error,
            next=_local(request.query.get("next", "/")),
        )
        self._cookie(response, request, LOGIN_CSRF_COOKIE, csrf, max_age=3600)
        return response

    async def login(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        name = str(form.get("username", ""))[:64].strip().lower()
        password = str(form.get("password", ""))
        if not csrf_ok(request.cookies.get(LOGIN_CSRF_COOKIE, ""), str(form.get("csrf", ""))):
            return self._login_form(request, error="forbidden_csrf", status=403)
        keys = (f"addr:{request.remote or '?'}", f"user:{name}")
        now = self._clock()
        if self._limiter.blocked(keys, now):
            return self._login_form(request, error="login_limited", status=429)
        try:
            found = await self._p.accounts.login(name, password)
        except StoreError:
            return self._login_form(request, error="server_busy", status=503)
        if found is None:
            self._limiter.failed(keys, now)
            log.info("console: failed login")  # no name: it may be a mistyped password
            return self._login_form(request, error="login_failed", status=401)
        self._limiter.succeeded(keys)
        token, _who = found
        response = web.HTTPSeeOther(_local(str(form.get("next", "/"))))
        self._cookie(response, request, SESSION_COOKIE, token)
        response.del_cookie(LOGIN_CSRF_COOKIE, path="/")
        raise response

    async def lang(self, request: web.Request) -> web.StreamResponse:
        to = request.query.get("to", "")
        response = web.HTTPSeeOther(_local(request.query.get("next", "/")))
        if to in LANGS:
            self._cookie(response, request, LANG_COOKIE, to, max_age=365 * 86400)
        raise response

    # ---- signed-in pages ----------------------------------------------------------------------

    async def logout(self, request: web.Request, who: LoggedIn) -> web.StreamResponse:
        await self._p.accounts.logout(request.cookies.get(SESSION_COOKIE, ""))
        response = web.HTTPSeeOther("/login")
        response.del_cookie(SESSION_COOKIE, path="/")
        raise response

    async def _devices(self, who: LoggedIn) -> list[DeviceGrant]:
        if who.user.role is not ConsoleRole.OPERATOR:
            return list(who.user.grants)
        granted = {g.device: g for g in await self._p.accounts.all_devices()}
        for dev in self._p.approvals.devices():
            granted.setdefault(dev, DeviceGrant(dev, ""))
        return [granted[d] for d in sorted(granted)]

    async def home(self, request: web.Request, who: LoggedIn) -> web.StreamResponse:
        devices = await self._devices(who)
        rows = [(g, self._p.fleet.facts(g.device)) for g in devices]
        return self._render(request, "home.html", who=who, rows=rows)

    async def child(self, request: web.Request, who: LoggedIn) -> web.StreamResponse:
        dev = self._device(request, who)
        try:
            history = await self._p.results.history(dev, HISTORY_LIMIT)
            done = await self._p.results.steps_done([i.instance_id for i in history])
            signals = await self._p.results.signals([i.instance_id for i in history])
        except StoreError:
            return self._render(request, "error.html", 503, who=who, message="server_busy")
        lang = self._lang(request)
        series: dict[str, list[tuple[float, float]]] = {}
        for inst in sorted(history, key=lambda i: i.created_ms or 0):
            key = f"{inst.task_id}/{inst.lesson_id}"
            series.setdefault(key, []).append(
                (float(inst.created_ms or 0), float(done.get(inst.instance_id, 0)))
            )
        times = [i.created_ms for i in history if i.created_ms is not None]
        plot = progress_svg(
            series,
            title=text("progress_plot", lang),
            x_labels=(self._when(min(times)), self._when(max(times))) if times else ("", ""),
        )
        return self._render(
            request,
            "child.html",
            who=who,
            dev=dev,
            label=self._label(who.user, dev),
            history=history,
            done=done,
            signals=signals,
            plot=plot,
            when=self._when,
        )

    async def lesson(self, request: web.Request, who: LoggedIn) -> web.StreamResponse:
        dev = self._device(request, who)
        try:
            found = await self._p.results.lesson(request.match_info["iid"][:128])
        except StoreError:
            return self._render(request, "error.html", 503, who=who, message="server_busy")
        if found is None or found[0].device_id != dev:
            return self._render(request, "error.html", 404, who=who, message="not_found")
        inst, steps = found
        rows = []
        for step in steps:
            try:
                mine = await self._p.recordings.recording(dev, inst.instance_id, step.step_index)
            except StoreError:
                mine = None
            ref = self._p.recordings.reference(
                inst.app_id or "", inst.task_id or "", inst.lesson_id or "", step.clip or ""
            )
            rows.append((step, mine, ref))
        return self._render(
            request,
            "lesson.html",
            who=who,
            dev=dev,
            label=self._label(who.user, dev),
            inst=inst,
            rows=rows,
            signals=run_signals(steps),
            when=self._when,
        )

    async def audio(self, request: web.Request, who: LoggedIn) -> web.StreamResponse:
        """A child's recording, on the page's short-lived link: the session may see the device
        (404 otherwise) and the link's signature is that device's (403 otherwise)."""
        dev = self._device(request, who)
        q = request.query
        found = await self._p.recordings.audio(
            dev, request.match_info["audio_id"], q.get("expires", ""), q.get("sig", "")
        )
        if isinstance(found, int):
            return web.Response(status=found, text="no such recording", headers=HEADERS)
        return _ranged(request, found, "audio/ogg")

    async def clip(self, request: web.Request, who: LoggedIn) -> web.StreamResponse:
        """A lesson's reference clip: only a clip the running catalog names (404 otherwise)."""
        m = request.match_info
        path = self._p.recordings.clip_file(m["app_id"], m["task_id"], m["lesson_id"], m["clip"])
        if path is None:
            return web.Response(status=404, text="no such clip", headers=HEADERS)
        return web.FileResponse(
            path,
            headers={"Cache-Control": "private, max-age=300", "X-Content-Type-Options": "nosniff"},
        )

    async def _export(self, dev: str) -> list[tuple[InstanceRecord, list[StepRecord]]]:
        out = []
        for inst in await self._p.results.history(dev, EXPORT_LIMIT):
            found = await self._p.results.lesson(inst.instance_id)
            if found is not None:
                out.append(found)
        return out

    async def export_json(self, request: web.Request, who: LoggedIn) -> web.StreamResponse:
        dev = self._device(request, who)
        lessons = await self._export(dev)
        body = {
            "device": dev,
            "lessons": [
                {"instance": i.to_json(), "steps": [s.to_json() for s in steps]}
                for i, steps in lessons
            ],
        }
        return web.Response(
            text=json.dumps(body, ensure_ascii=False, indent=1),
            content_type="application/json",
            headers={**HEADERS, "Content-Disposition": f'attachment; filename="{dev}.json"'},
        )

    async def export_csv(self, request: web.Request, who: LoggedIn) -> web.StreamResponse:
        dev = self._device(request, who)
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(
            ["started_ms", "instance_id", "app_id", "task_id", "lesson_id", "state", "step",
             "expected_text", "asr_text", "metrics", "completed_ms", "response_latency_ms",
             "step_completed"]
        )  # fmt: skip
        for inst, steps in await self._export(dev):
            for s in steps:
                metrics = ";".join(f"{m.method}={m.value:g}" for m in s.metrics)
                writer.writerow(
                    [inst.created_ms, inst.instance_id, inst.app_id, inst.task_id,
                     inst.lesson_id, inst.state, s.step_index, s.expected_text, s.asr_text,
                     metrics, s.completed_ms, s.response_latency_ms, s.step_completed]
                )  # fmt: skip
        return web.Response(
            body=out.getvalue().encode("utf-8-sig"),  # BOM: spreadsheet programs read UTF-8
            content_type="text/csv",
            charset="utf-8",
            headers={**HEADERS, "Content-Disposition": f'attachment; filename="{dev}.csv"'},
        )

    async def steer_page(self, request: web.Request, who: LoggedIn) -> web.StreamResponse:
        dev = self._device(request, who)
        live = await self._live_html(request, dev)
        return self._render(
            request,
            "steer.html",
            who=who,
            dev=dev,
            label=self._label(who.user, dev),
            lessons=self._p.lessons(),
            live=live,
            result=request.query.get("result"),
            priority=int(PRIORITY[who.user.role]),
        )

    async def steer(self, request: web.Request, who: LoggedIn) -> web.StreamResponse:
        dev = self._device(request, who)
        form = await request.post()
        try:
            action = ControlAction(str(form.get("action", "")))
        except ValueError:
            raise web.HTTPBadRequest(text="action: start|pause|resume|stop") from None
        if action is ControlAction.RESTART:
            raise web.HTTPBadRequest(text="action: start|pause|resume|stop")
        lesson = None
        if action is ControlAction.START:
            key = str(form.get("lesson", ""))
            lesson = next((c for c in self._p.lessons() if c.key == key), None)
            if lesson is None:
                raise web.HTTPBadRequest(text="lesson: one of the catalog's")
        ok = self._p.steering.steer(
            dev, action, priority=int(PRIORITY[who.user.role]), source="console", lesson=lesson
        )
        log.info("console: %s asked %s on %s", who.user.role.value, action.value, dev)
        result = "sent" if ok else "send_failed"
        if request.headers.get("HX-Request"):
            return self._render(request, "result.html", who=who, result=result)
        raise web.HTTPSeeOther(f"/steer/{dev}?result={result}")

    async def _live_html(self, request: web.Request, dev: str) -> str:
        try:
            latest = await self._p.results.history(dev, 1)
            found = await self._p.results.lesson(latest[0].instance_id) if latest else None
        except StoreError:
            found = None
        lang = self._lang(request)
        return self._env.get_template("live.html").render(
            t=lambda key: text(key, lang),
            inst=found[0] if found else None,
            steps=found[1] if found else [],
            when=self._when,
        )

    async def live_events(self, request: web.Request, who: LoggedIn) -> web.StreamResponse:
        """Server-sent events: the device's latest lesson (an HTML fragment) at each change."""
        dev = self._device(request, who)
        wake = self._hub.join()
        if wake is None:
            return web.Response(status=503, text="too many live views", headers=HEADERS)
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            }
        )
        try:
            await response.prepare(request)
            last = None
            while not self._hub.closed:
                wake.clear()
                html = await self._live_html(request, dev)
                if html != last:
                    data = "".join(f"data: {line}\n" for line in html.splitlines())
                    await response.write(f"event: steps\n{data}\n".encode())
                    last = html
                try:
                    async with asyncio.timeout(KEEPALIVE_S):
                        await wake.wait()
                except TimeoutError:
                    await response.write(b": keep-alive\n\n")
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            self._hub.leave(wake)
        return response

    async def fleet(self, request: web.Request, who: LoggedIn) -> web.StreamResponse:
        if who.user.role is not ConsoleRole.OPERATOR:
            return self._render(request, "error.html", 404, who=who, message="not_found")
        try:
            devices = await self._devices(who)
            running = {i.device_id: i for i in await self._p.running()}
        except StoreError:
            return self._render(request, "error.html", 503, who=who, message="server_busy")
        rows = [
            (g, self._p.fleet.facts(g.device), running.get(g.device), self._p.content.job(g.device))
            for g in devices
        ]
        manifests = []
        for app_id in self._p.content.apps():
            manifest = await self._p.content.manifest(app_id)
            if manifest is not None:
                manifests.append(manifest)
        return self._render(
            request,
            "fleet.html",
            who=who,
            rows=rows,
            manifests=manifests,
            lessons=self._p.lessons(),
            waiting=self._p.approvals.waiting(),
            ota=self._p.approvals.enabled,
            result=request.query.get("result"),
            synced=request.query.get("sync"),
            when=self._when,
        )

    async def sync(self, request: web.Request, who: LoggedIn) -> web.StreamResponse:
        """Operators: sync a catalog lesson's audio to a board's SD card (a lesson sync job)."""
        if who.user.role is not ConsoleRole.OPERATOR:
            return self._render(request, "error.html", 404, who=who, message="not_found")
        form = await request.post()
        dev = str(form.get("device", ""))
        key = str(form.get("lesson", ""))
        lesson = next((c for c in self._p.lessons() if c.key == key), None)
        if not DEVICE_RE.fullmatch(dev) or lesson is None:
            raise web.HTTPBadRequest(text="device and lesson: one of the catalog's")
        job = self._p.content.start_sync(dev, lesson)
        outcome = job if isinstance(job, str) else "started"
        log.info("console: operator asked a lesson sync of %s: %s", dev, outcome)
        raise web.HTTPSeeOther(f"/fleet?sync={outcome}#sync-{dev}")

    async def approve(self, request: web.Request, who: LoggedIn) -> web.StreamResponse:
        if who.user.role is not ConsoleRole.OPERATOR:
            return self._render(request, "error.html", 404, who=who, message="not_found")
        form = await request.post()
        code = str(form.get("code", "")).strip()
        if not (len(code) == 6 and code.isascii() and code.isdigit()):
            raise web.HTTPSeeOther("/fleet?result=unknown")
        _ok, outcome = await self._p.approvals.approve(code)
        raise web.HTTPSeeOther(f"/fleet?result={outcome}")


def _ranged(request: web.Request, body: bytes, content_type: str) -> web.Response:
    """``body`` whole, or the one byte range asked (206): a browser's player seeks with it."""
    headers = {**HEADERS, "Accept-Ranges": "bytes", "Cache-Control": "private, no-store"}
    if "Range" not in request.headers:
        return web.Response(body=body, content_type=content_type, headers=headers)
    try:
        wanted = request.http_range
        start, stop, _ = wanted.indices(len(body))
    except ValueError:
        start, stop = 0, -1
    if start >= stop:
        headers["Content-Range"] = f"bytes */{len(body)}"
        return web.Response(status=416, headers=headers)
    headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(body)}"
    return web.Response(
        status=206, body=body[start:stop], content_type=content_type, headers=headers
    )


def _ms(value: float | None) -> str:
    """A latency in whole milliseconds for a page ("—" when there is none)."""
    return "—" if value is None else f"{value:.0f}"


def _local(path: str) -> str:
    """Only a path on this site (an open redirect otherwise)."""
    if not path.startswith("/") or path.startswith("//") or "\\" in path or "\n" in path:
        return "/"
    return path
