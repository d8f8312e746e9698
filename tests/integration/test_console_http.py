"""The console's guards over plain HTTP, on the composed gateway (real Mosquitto, simulated board):
the first account from the 0600 bootstrap file, cookie flags, CSRF on login and on every POST,
login rate limiting, the static allow-list, no open redirect, roles, and live streams ending
when the gateway stops."""

from __future__ import annotations

import asyncio
import re
import stat
from pathlib import Path

import aiohttp
import pytest

from gateway.console import BOOTSTRAP_FILE
from gateway.console.accounts import ConsoleRole, DeviceGrant
from tests.support.broker import Broker
from tests.support.lesson_rig import LessonRig, lesson_rig

pytestmark = pytest.mark.integration

PASSWORD = "correct horse battery"


def base(rig: LessonRig) -> str:
    assert rig.gw.console is not None
    return f"http://127.0.0.1:{rig.gw.console.server.port}"


async def login(http: aiohttp.ClientSession, url: str, name: str, password: str) -> int:
    async with http.get(f"{url}/login") as page:
        found = re.search(r'name="csrf" value="([^"]+)"', await page.text())
        assert found is not None
    form = {"csrf": found.group(1), "username": name, "password": password, "next": "/"}
    async with http.post(f"{url}/login", data=form, allow_redirects=False) as answer:
        return answer.status


async def page_csrf(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(f"{url}/") as page:
        found = re.search(r'name="csrf" value="([^"]+)"', await page.text())
        assert found is not None
        return found.group(1)


async def test_bootstrap_cookies_csrf_and_rate_limit(broker: Broker, tmp_path: Path) -> None:
    async with lesson_rig(broker, tmp_path) as rig:
        url = base(rig)
        bootstrap = rig.settings.data_dir / BOOTSTRAP_FILE
        assert rig.gw.console is not None
        async with asyncio.timeout(15):
            await rig.gw.console.server.wait_started()  # it listens once the account is made
        assert stat.S_IMODE(bootstrap.stat().st_mode) == 0o600
        password = re.search(r"password: (\S+)", bootstrap.read_text())
        assert password is not None

        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            assert await login(http, url, "admin", password.group(1)) == 303
            (cookie,) = [c for c in http.cookie_jar if c.key == "snlpgw_console"]
            assert cookie["httponly"]
            assert cookie["samesite"] == "Strict"
            async with http.get(f"{url}/fleet") as fleet:
                assert fleet.status == 200
                assert fleet.headers["Content-Security-Policy"].startswith("default-src 'self'")
                assert "no-store" in fleet.headers["Cache-Control"]
            # Every POST needs the session's CSRF token.
            async with http.post(f"{url}/fleet/approve", data={"code": "123456"}) as forged:
                assert forged.status == 403
            csrf = await page_csrf(http, url)
            async with http.post(
                f"{url}/fleet/approve",
                data={"code": "123456", "csrf": csrf},
                allow_redirects=False,
            ) as approve:
                assert approve.status == 303
                assert approve.headers["Location"] == "/fleet?result=unknown"
            async with http.post(
                f"{url}/logout", data={"csrf": csrf}, allow_redirects=False
            ) as out:
                assert out.status == 303
            async with http.get(f"{url}/fleet", allow_redirects=False) as gone:
                assert gone.status == 303  # the session ended server-side

        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            # Login without the login form's token: refused before the password is looked at.
            form = {"username": "admin", "password": password.group(1)}
            async with http.post(f"{url}/login", data=form) as no_token:
                assert no_token.status == 403
            for _ in range(5):
                assert await login(http, url, "admin", "wrong password") == 401
            # Locked for a minute now, even with the right password.
            assert await login(http, url, "admin", password.group(1)) == 429


async def test_roles_static_and_redirects(broker: Broker, tmp_path: Path) -> None:
    async with lesson_rig(broker, tmp_path) as rig:
        url = base(rig)
        assert rig.gw.console is not None
        await rig.gw.console.accounts.add(
            "teacher", ConsoleRole.TEACHER, PASSWORD, (DeviceGrant(rig.dev, "一班"),)
        )
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            async with http.get(f"{url}/static/htmx.min.js") as js:
                assert js.status == 200
                assert "htmx" in await js.text()
            for bad in ("../__init__.py", "console.py", "x"):
                async with http.get(f"{url}/static/{bad}") as nope:
                    assert nope.status == 404
            async with http.get(
                f"{url}/lang?to=en&next=//evil.example/", allow_redirects=False
            ) as lang:
                assert lang.headers["Location"] == "/"
            async with http.get(f"{url}/child/{rig.dev}", allow_redirects=False) as anon:
                assert anon.status == 303
                assert anon.headers["Location"].startswith("/login")
            async with http.get(f"{url}/steer/{rig.dev}/events") as anon_events:
                assert anon_events.status == 401
            assert await login(http, url, "teacher", PASSWORD) == 303
            async with http.get(f"{url}/fleet") as fleet:
                assert fleet.status == 404  # operators only
            async with http.get(f"{url}/child/{rig.dev}") as child:
                assert child.status == 200
            async with http.get(f"{url}/child/{rig.dev}/export.csv") as exported:
                assert exported.status == 200
                assert (await exported.read()).startswith(b"\xef\xbb\xbfstarted_ms,")
            # A live stream is open when the gateway stops: the stream ends, nothing leaks.
            async with http.get(f"{url}/steer/{rig.dev}/events") as events:
                assert events.headers["Content-Type"] == "text/event-stream"
                first = await events.content.readuntil(b"\n\n")
                assert first.startswith(b"event: steps\n")
                await rig.stop_gateway()
                async with asyncio.timeout(10):
                    rest = await events.content.read()
                assert b"event" not in rest
