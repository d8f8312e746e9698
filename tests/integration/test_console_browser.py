"""The console in a real browser: Debian's chromium driven by Playwright, against the composed
gateway on a real Mosquitto with a simulated board (tests/support/lesson_rig.py).

Each role logs in; a parent starts a lesson and watches its steps arrive live (server-sent
events) while the board plays it; another family's parent is refused that child by URL, by
export and by a forged steering request; the language switches; the operator sees the fleet.
Screenshots go to ``SNLPGW_CONSOLE_SHOTS`` when set (``docs/console/`` is made that way), else
to the test's temporary directory.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from gateway.console.accounts import ConsoleRole, DeviceGrant
from gateway.console.i18n import text
from gateway.store import InstanceRecord, InstanceState, StepRecord, StoredMetric
from tests.integration.test_lesson_content import heard_heartbeat, make_resources, on_sd
from tests.support.asr_engines import RaisingEngine
from tests.support.broker import Broker
from tests.support.lesson_rig import APP, LESSON, TASK, LessonRig, lesson_rig
from tests.support.voice_lesson import CATALOG, scripted_lesson
from tests.support.voice_lesson import lesson_rig as voice_lesson_rig

# Hang guards, not timings: a browser, a gateway and a board on two cores shared with others.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CHROMIUM = "/usr/bin/chromium"
PASSWORD = "correct horse battery"
OTHER_DEVICE = "aa_bb_cc_00_00_99"
XIAOZHI_DEV = "aa_bb_cc_00_00_42"
WAIT_MS = 20_000
expect.set_options(timeout=WAIT_MS)  # every wait in this module: woken by the page, bounded

if not Path(CHROMIUM).exists():  # the Makefile installs it; without it this module cannot run
    pytest.skip(f"{CHROMIUM} missing (make system-deps installs chromium)", allow_module_level=True)


def shots(tmp_path: Path) -> Path:
    target = Path(os.environ.get("SNLPGW_CONSOLE_SHOTS") or tmp_path / "shots")
    target.mkdir(parents=True, exist_ok=True)
    return target


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            await launched.close()


async def accounts(rig: LessonRig) -> str:
    """Four accounts; the console's base URL."""
    console = rig.gw.console
    assert console is not None
    book = console.accounts
    await book.add("mama", ConsoleRole.PARENT, PASSWORD, (DeviceGrant(rig.dev, "小明"),))
    await book.add("other", ConsoleRole.PARENT, PASSWORD, (DeviceGrant(OTHER_DEVICE, "小红"),))
    await book.add("teacher", ConsoleRole.TEACHER, PASSWORD, (DeviceGrant(rig.dev, "一班"),))
    await book.add("ops", ConsoleRole.OPERATOR, PASSWORD)
    return f"http://127.0.0.1:{console.server.port}"


async def login(browser: Browser, base: str, name: str, *, locale: str = "zh-CN") -> Page:
    context = await browser.new_context(
        locale=locale, viewport={"width": 1100, "height": 760}, base_url=base
    )
    page = await context.new_page()
    await page.goto("/")
    await expect(page).to_have_url(f"{base}/login?next=/")
    await page.get_by_label("用户名" if locale.startswith("zh") else "User name").fill(name)
    await page.get_by_label("密码" if locale.startswith("zh") else "Password").fill(PASSWORD)
    await page.keyboard.press("Enter")  # keyboard only: the form submits from the field
    await expect(page).to_have_url(f"{base}/")
    return page


async def test_parent_starts_a_lesson_and_watches_it_live(
    broker: Broker, tmp_path: Path, browser: Browser
) -> None:
    out = shots(tmp_path)
    async with lesson_rig(broker, tmp_path) as rig:
        base = await accounts(rig)
        page = await login(browser, base, "mama")
        await expect(page.get_by_role("cell", name="小明")).to_be_visible()
        await page.screenshot(path=str(out / "home-parent.png"), full_page=True)

        await page.get_by_role("link", name="控制课程").click()
        await expect(page.get_by_text("等待课程开始")).to_be_visible()
        await page.get_by_label("选择课程").select_option(f"{APP}/{TASK}/{LESSON}")
        await page.get_by_role("button", name="开始").click()
        await expect(page.get_by_role("status")).to_have_text("指令已发送。")
        # The steps arrive over server-sent events as the board plays the lesson: no reload.
        live = page.locator("#live")
        await expect(live.locator("tbody tr")).to_have_count(4, timeout=WAIT_MS)
        await expect(live.locator(".state")).to_have_attribute(
            "data-state", "completed", timeout=WAIT_MS
        )
        await page.screenshot(path=str(out / "steer.png"), full_page=True)

        (instance,) = await rig.store().list_instances(device_id=rig.dev)
        assert instance.priority == 3  # a parent's request (SPEC §5)
        assert instance.source == "console"
        assert instance.state is InstanceState.COMPLETED

        # An earlier arithmetic run whose steps carry behaviour signals (stored as the inline
        # path stores them: tests/integration/test_results_api.py runs one for real).
        signalled = await signals_run(rig, instance.created_ms)
        signalled_ms = (instance.created_ms or 0) - 60_000

        await page.get_by_role("link", name="学习进度").click()
        await expect(page.locator("svg.plot circle")).to_have_count(2)
        await expect(page.get_by_role("cell", name="已完成")).to_have_count(2)
        row = page.locator("tbody tr", has=page.get_by_role("cell", name="arithmetic_10/round1"))
        # answered 3 of 4, 2 ran to the end, latency mean (800+1500+400)/3 = 900, median 800
        await expect(row.locator("td.signal")).to_have_text(["3 / 4", "2 / 4", "900", "800"])
        plain = page.locator("tbody tr", has=page.get_by_role("cell", name=f"{TASK}/{LESSON}"))
        await expect(plain.locator("td.signal")).to_have_count(0)  # shadowing: no signals
        await expect(
            page.get_by_role("columnheader", name=text("sig_mean_ms", "zh-CN"))
        ).to_be_visible()
        await page.screenshot(path=str(out / "child.png"), full_page=True)
        await plain.get_by_role("link", name="详情").click()
        await expect(page.locator("table.steps tbody tr")).to_have_count(4)
        # The board simulator answers no speech: no step has a recording (no player shown).
        await expect(page.get_by_text("没有录音")).to_have_count(4)
        await expect(page.locator("audio.recording")).to_have_count(0)

        async with page.expect_download() as download:
            await page.goto(f"/child/{rig.dev}")
            await page.get_by_role("link", name="导出 JSON").click()
        saved = await (await download.value).path()
        exported = saved.read_text(encoding="utf-8")
        assert f'"instance_id": "{instance.instance_id}"' in exported
        assert '"response_latency_ms": 1500' in exported  # the signalled run's steps
        table = await page.request.get(f"/child/{rig.dev}/export.csv")
        lines = (await table.text()).lstrip("\ufeff").splitlines()
        assert lines[0].endswith(",response_latency_ms,step_completed")
        assert any(line.startswith(f"{signalled_ms},signals-run,") and line.endswith(",1500,1")
                   for line in lines)  # fmt: skip

        # The signalled run's page: its signals, then each step's, in both languages.
        await page.goto(f"/child/{rig.dev}/lesson/{signalled}")
        summary = page.locator("section.signals")
        await expect(summary).to_contain_text("开口句数: 3 / 4")
        await expect(summary).to_contain_text(f"{text('sig_median_ms', 'zh-CN')}: 800")
        await expect(page.locator("table.steps tbody tr td.signal")).to_have_text(
            ["800", "1", "—", "0", "1500", "1", "400", "0"]
        )
        await page.get_by_role("link", name="English").click()
        await expect(page.get_by_role("heading", name="Behaviour signals")).to_be_visible()
        await expect(summary).to_contain_text("Steps run to the end: 2 / 4")
        await expect(summary).to_contain_text("Mean response time (ms): 900")
        await expect(page.get_by_role("columnheader", name="Response time (ms)")).to_be_visible()
        await page.screenshot(path=str(out / "lesson-signals-en.png"), full_page=True)


async def signals_run(rig: LessonRig, before_ms: int | None) -> str:
    """A finished four-question arithmetic run a minute before ``before_ms``, its steps with
    the signals the inline path stores (latency None: nothing said)."""
    created = (before_ms or 0) - 60_000
    store = rig.store()
    store.submit_instance(
        InstanceRecord(
            "signals-run", device_id=rig.dev, app_id="thinking_games", task_id="arithmetic_10",
            lesson_id="round1", mode="STEPS", state=InstanceState.COMPLETED, created_ms=created,
            ended_ms=created + 40_000,
        )
    )  # fmt: skip
    answers = [("3", 800, 1), (None, None, 0), ("5", 1500, 1), (None, 400, 0)]
    for index, (said, latency, completed) in enumerate(answers):
        store.submit_step(
            StepRecord(
                "signals-run", index, prompt_text=f"{index} + 3 = ?", expected_text=str(index + 3),
                asr_text=said, metrics=(StoredMetric("task.correct", float(completed)),),
                assessed_at=created + 10_000 * index, response_latency_ms=latency,
                step_completed=completed,
            )
        )  # fmt: skip
    await store.flush()
    return "signals-run"


async def test_a_parent_cannot_reach_another_familys_child(
    broker: Broker, tmp_path: Path, browser: Browser
) -> None:
    async with lesson_rig(broker, tmp_path) as rig:
        base = await accounts(rig)
        page = await login(browser, base, "other")
        await expect(page.get_by_role("cell", name="小红")).to_be_visible()
        await expect(page.get_by_text("小明")).to_have_count(0)
        for path in (
            f"/child/{rig.dev}",
            f"/steer/{rig.dev}",
            f"/child/{rig.dev}/export.json",
            f"/child/{rig.dev}/export.csv",
            f"/steer/{rig.dev}/events",
            "/fleet",
        ):
            answer = await page.request.get(path)
            assert answer.status == 404, path
            assert "小明" not in await answer.text()
        # A forged steering request with this parent's own valid CSRF token: still refused.
        await page.goto("/")
        csrf = await page.locator("input[name=csrf]").first.get_attribute("value")
        forged = await page.request.post(
            f"/steer/{rig.dev}",
            form={"csrf": csrf or "", "action": "start", "lesson": f"{APP}/{TASK}/{LESSON}"},
        )
        assert forged.status == 404
        # And no token at all is refused before anything else.
        no_token = await page.request.post(f"/steer/{OTHER_DEVICE}", form={"action": "stop"})
        assert no_token.status == 403
        assert await rig.store().list_instances(device_id=rig.dev) == []


async def test_teacher_and_operator_and_language(
    broker: Broker, tmp_path: Path, browser: Browser
) -> None:
    out = shots(tmp_path)
    async with lesson_rig(broker, tmp_path) as rig:
        base = await accounts(rig)
        # Teacher: the class's device; a teacher's start is priority 2 (never preempts a parent).
        page = await login(browser, base, "teacher")
        await expect(page.get_by_role("cell", name="一班")).to_be_visible()
        await expect(page.get_by_role("link", name="设备总览")).to_have_count(0)
        await page.goto(f"/steer/{rig.dev}")
        await page.get_by_role("button", name="开始").click()
        await expect(page.locator("#live tbody tr").first).to_be_visible(timeout=WAIT_MS)
        (instance,) = await rig.store().list_instances(device_id=rig.dev)
        assert instance.priority == 2
        await page.get_by_role("button", name="停止").click()
        await expect(page.locator("#live .state")).to_have_attribute(
            "data-state", "cancelled", timeout=WAIT_MS
        )

        # A Xiaozhi board known to the OTA trust book asks again with a new Client-Id (a
        # reflashed board): it waits for an activation code to be approved.
        ota = rig.gw.xiaozhi.ota
        assert ota is not None
        book, now = ota.book, ota.clock()
        book.request(XIAOZHI_DEV, "uuid-old", serial=None, now=now)  # first contact: bound
        book.request(XIAOZHI_DEV, "uuid-new", serial=None, now=now)  # new Client-Id: a code
        (waiting,) = book.pending(now)

        # Operator, browser asking for English: the fleet with the board online.
        page = await login(browser, base, "ops", locale="en-GB")
        await expect(page.locator("html")).to_have_attribute("lang", "en")
        await page.get_by_role("link", name="Fleet").click()
        row = page.get_by_role("row").filter(has_text=rig.dev)
        await expect(row.get_by_text("Online")).to_be_visible()
        # An ops alarm about the board shows in its row (raised as the gateway raises them).
        rig.gw.service.ops.alarm("board_command_failed", device=rig.dev, cmd="play")
        await page.reload()
        await expect(row.get_by_role("cell", name="board_command_failed")).to_be_visible()
        await expect(
            page.get_by_role("heading", name="Device activation approvals")
        ).to_be_visible()
        await expect(page.get_by_role("row").filter(has_text=waiting.code)).to_be_visible()
        await page.screenshot(path=str(out / "fleet-approval-en.png"), full_page=True)
        await page.get_by_label("The 6-digit code the device shows").fill(waiting.code)
        await page.get_by_role("button", name="Approve").click()
        await expect(page.get_by_role("status")).to_have_text("Approved.")
        await expect(page.get_by_text("No device is waiting for approval.")).to_be_visible()
        assert book.bindings[XIAOZHI_DEV].client_id == "uuid-new"
        await page.screenshot(path=str(out / "fleet-en.png"), full_page=True)
        # Switch to Chinese with the keyboard-reachable link; it sticks across pages.
        await page.get_by_role("link", name="中文").click()
        await expect(page.get_by_role("heading", name="设备总览")).to_be_visible()
        await page.screenshot(path=str(out / "fleet.png"), full_page=True)
        await page.goto("/")
        await expect(page.locator("html")).to_have_attribute("lang", "zh-CN")

        # The login page in both languages (a fresh browser: no cookie, Accept-Language only).
        for locale, name in (("zh-CN", "login.png"), ("en-US", "login-en.png")):
            context = await browser.new_context(locale=locale, base_url=base)
            fresh = await context.new_page()
            await fresh.goto("/login")
            await fresh.screenshot(path=str(out / name))
            await context.close()


async def test_pause_resume_stop_and_a_parent_preempts_a_teacher(
    broker: Broker, tmp_path: Path, browser: Browser
) -> None:
    # Clips long enough (1.5 s each) for the buttons to land mid-lesson.
    async with lesson_rig(broker, tmp_path, durations_ms=(1500, 1500, 1500, 1500)) as rig:
        base = await accounts(rig)
        teacher = await login(browser, base, "teacher")
        await teacher.goto(f"/steer/{rig.dev}")
        await teacher.get_by_label("选择课程").select_option(f"{APP}/{TASK}/{LESSON}")
        await teacher.get_by_role("button", name="开始").click()
        state = teacher.locator("#live .state")
        await expect(state).to_have_attribute("data-state", "running", timeout=WAIT_MS)
        (first,) = await rig.store().list_instances(device_id=rig.dev)

        # The parent's start (priority 3) preempts the teacher's lesson (priority 2); the
        # teacher's page follows live to the parent's lesson.
        parent = await login(browser, base, "mama")
        await parent.goto(f"/steer/{rig.dev}")
        await parent.get_by_label("选择课程").select_option(f"{APP}/{TASK}/{LESSON}")
        await parent.get_by_role("button", name="开始").click()
        live = parent.locator("#live .state")
        await expect(live).not_to_have_attribute(
            "data-instance", first.instance_id, timeout=WAIT_MS
        )
        await expect(live).to_have_attribute("data-state", "running", timeout=WAIT_MS)
        found = await rig.store().list_instances(device_id=rig.dev)
        assert len(found) == 2
        newest, older = found
        assert older.instance_id == first.instance_id
        assert older.state is InstanceState.CANCELLED
        assert older.reason == "preempted"
        assert newest.priority == 3

        await parent.get_by_role("button", name="暂停").click()
        await expect(live).to_have_attribute("data-state", "paused", timeout=WAIT_MS)
        await expect(state).to_have_attribute("data-state", "paused", timeout=WAIT_MS)
        await parent.get_by_role("button", name="继续").click()
        await expect(live).to_have_attribute("data-state", "running", timeout=WAIT_MS)
        await parent.get_by_role("button", name="停止").click()
        await expect(live).to_have_attribute("data-state", "cancelled", timeout=WAIT_MS)


async def test_a_parent_plays_the_childs_recording_beside_the_reference_clip(
    broker: Broker, tmp_path: Path, browser: Browser, device_id: str
) -> None:
    """A voice lesson (espeak-ng speech from the Xiaozhi simulator) archives the child's
    answers; the lesson page plays each beside the lesson's reference clip, both through the
    console's listener. Another family's parent gets 404 for the recording's URL; a forged or
    moved signature gets 403."""
    out = shots(tmp_path)
    resources = tmp_path / "resources"
    shutil.copytree(CATALOG / "resources", resources)
    unit = resources / APP / TASK / "lessons" / LESSON
    clip_bytes = b"ID3\x03\x00\x00\x00\x00\x00\x00reference clip 01"
    (unit / "01.mp3").write_bytes(clip_bytes)  # the only clip with a file; 02-04 are missing
    async with voice_lesson_rig(
        broker, tmp_path, device_id, RaisingEngine, resource_dir=resources
    ) as (gw, seen, device, backend):
        instance_id = await scripted_lesson(device, seen, backend, device_id)
        assert gw.archive is not None
        assert gw.console is not None
        await gw.archive.drained()
        await gw.store.flush()
        archived = await gw.archive.audio_of_step(instance_id, 0)
        assert archived is not None
        blob = await gw.archive.get(archived.audio_id)

        book = gw.console.accounts
        await book.add("mama", ConsoleRole.PARENT, PASSWORD, (DeviceGrant(device_id, "小明"),))
        await book.add("other", ConsoleRole.PARENT, PASSWORD, (DeviceGrant(OTHER_DEVICE, "小红"),))
        base = f"http://127.0.0.1:{gw.console.server.port}"

        page = await login(browser, base, "mama")
        await page.goto(f"/child/{device_id}/lesson/{instance_id}")
        await expect(page.locator("table.steps tbody tr")).to_have_count(4)
        # Steps 0, 1 and 3 were spoken (archived); step 2 was silent: nothing kept.
        recordings = page.locator("audio.recording")
        await expect(recordings).to_have_count(3)
        await expect(page.get_by_text("没有录音")).to_have_count(1)
        first = recordings.first
        src = await first.get_attribute("src")
        assert src is not None
        assert src.startswith(f"/child/{device_id}/audio/{archived.audio_id}?expires=")
        # The browser loads it as audio it can play: metadata read, a duration.
        await page.wait_for_function(
            "el => el.readyState >= 1 && el.duration > 0", arg=await first.element_handle()
        )
        duration = await first.evaluate("el => el.duration")
        assert 0.5 < duration < 10, duration
        fetched = await page.request.get(src)
        assert fetched.status == 200
        assert fetched.headers["content-type"] == "audio/ogg"
        body = await fetched.body()
        assert body == blob
        assert body.startswith(b"OggS")
        assert b"OpusHead" in body[:200]
        ranged = await page.request.get(src, headers={"Range": "bytes=0-3"})
        assert ranged.status == 206
        assert await ranged.body() == b"OggS"
        # The reference clip, beside it: the catalog's 01.mp3, served by the console.
        references = page.locator("audio.reference")
        await expect(references).to_have_count(1)  # only 01.mp3 has a file
        ref_src = await references.first.get_attribute("src")
        assert ref_src == f"/clip/{APP}/{TASK}/{LESSON}/01.mp3"
        ref = await page.request.get(ref_src)
        assert ref.status == 200
        assert await ref.body() == clip_bytes
        # Only clips the catalog names: its transcript file, or a path out, is not served.
        for path in (
            f"/clip/{APP}/{TASK}/{LESSON}/04.txt",
            f"/clip/{APP}/{TASK}/{LESSON}/02.mp3",
            f"/clip/{APP}/{TASK}/{LESSON}/..%2F..%2F..%2Fapp.json",
        ):
            assert (await page.request.get(path)).status == 404, path
        await expect(page.get_by_text("Good morning.").first).to_be_visible()
        await page.screenshot(path=str(out / "lesson.png"), full_page=True)

        # Forged: a changed signature, an extended expiry, no signature at all.
        head, _, sig = src.partition("&sig=")
        expires = head.rsplit("=", 1)[1]
        forged = (
            f"{head}&sig={'0' * len(sig)}",
            src.replace(f"expires={expires}", f"expires={int(expires) + 3_600_000}"),
            src.split("?")[0],
        )
        for url in forged:
            answer = await page.request.get(url)
            assert answer.status == 403, url
            assert (await answer.body())[:4] != b"OggS"

        # Another family's parent: the recording's URL (signature and all) is not found.
        other = await login(browser, base, "other")
        answer = await other.request.get(src)
        assert answer.status == 404
        assert (await answer.body())[:4] != b"OggS"
        # The same recording moved under that parent's own device: the signature is bound
        # to the child's device, so it is refused.
        moved = src.replace(f"/child/{device_id}/", f"/child/{OTHER_DEVICE}/")
        answer = await other.request.get(moved)
        assert answer.status == 403
        assert (await answer.body())[:4] != b"OggS"

        # The operator's fleet: this board is also a Xiaozhi device (its hello was heard).
        await book.add("ops", ConsoleRole.OPERATOR, PASSWORD, (DeviceGrant(device_id, ""),))
        ops = await login(browser, base, "ops")
        await ops.goto("/fleet")
        row = ops.get_by_role("row").filter(has_text=device_id)
        await expect(row.get_by_text("小智设备")).to_be_visible()
        await expect(row.get_by_role("cell", name="sim-1.0")).to_be_visible()


async def test_operator_sees_board_status_and_lesson_content_and_syncs_a_board(
    broker: Broker, tmp_path: Path, browser: Browser
) -> None:
    """The fleet page: the board's heartbeat figures, each app's manifest (resources, missing
    files), and a lesson synced to the board's SD card from the page, its progress shown."""
    out = shots(tmp_path)
    resources = tmp_path / "resources"
    files = await asyncio.to_thread(make_resources, resources)  # the shadowing lesson's clips
    sd = tmp_path / "sd"
    sim = {"sd_dir": sd, "download_chunk": 16 * 1024, "fw": "sim-2.1", "rssi": -61,
           "sd_free_mb": 2048.0}  # fmt: skip
    async with lesson_rig(broker, tmp_path, runtime={"resource_dir": resources}, sim=sim) as rig:
        await heard_heartbeat(rig)
        base = await accounts(rig)

        # A parent may not sync (404, like the fleet page), and no POST goes without CSRF.
        parent = await login(browser, base, "mama")
        csrf = await parent.locator("input[name=csrf]").first.get_attribute("value")
        form = {"device": rig.dev, "lesson": f"{APP}/{TASK}/{LESSON}"}
        answer = await parent.request.post("/fleet/sync", form={"csrf": csrf or "", **form})
        assert answer.status == 404
        assert (await parent.request.post("/fleet/sync", form=form)).status == 403
        sync = rig.gw.content_sync
        assert sync is not None
        assert sync.job_of(rig.dev) is None

        page = await login(browser, base, "ops", locale="en-GB")
        await page.goto("/fleet")
        row = page.get_by_role("row").filter(has_text=rig.dev)
        await expect(row.get_by_role("cell", name="sim-2.1")).to_be_visible()
        await expect(row.get_by_role("cell", name="-61 dBm")).to_be_visible()
        await expect(row.get_by_role("cell", name="2048 MB")).to_be_visible()
        await expect(row.get_by_text("never synced")).to_be_visible()
        await expect(row.get_by_text("not reported")).to_have_count(0)  # last seen: a time
        # Lesson content per app: the shadowing task has its 4 clips; the repeater's is missing.
        content = page.locator("table.content")
        shadowing = content.locator(f"tr[data-task='{APP}/{TASK}']")
        await expect(shadowing.locator("td").nth(2)).to_contain_text("4")
        await expect(shadowing.locator("td").nth(3)).to_have_text("none")
        repeater = content.locator(f"tr[data-task='{APP}/repeater']")
        await expect(repeater.locator("td").nth(3)).to_contain_text(
            f"/{APP}/repeater/lessons/{LESSON}/01.mp3"
        )

        await row.get_by_label(f"Lesson to sync {rig.dev}").select_option(f"{APP}/{TASK}/{LESSON}")
        await row.get_by_role("button", name=f"Sync to board {rig.dev}").click()
        await expect(page.get_by_role("status")).to_have_text("Sync started.")
        # The job's progress: followed on the page (htmx) until every file is on the SD card.
        job = page.locator(f"#sync-{rig.dev} .job")
        await expect(job).to_have_attribute("data-state", "done", timeout=WAIT_MS)
        await expect(page.locator(f"#sync-{rig.dev} .files")).to_have_text("4/4")
        assert await asyncio.to_thread(on_sd, sd) == files
        await page.get_by_role("link", name="中文").click()
        await expect(page.get_by_role("heading", name="课程内容")).to_be_visible()
        await expect(page.locator(f"#sync-{rig.dev} .job")).to_have_text("已完成")
        await page.screenshot(path=str(out / "fleet-content.png"), full_page=True)


PHONE = {"width": 390, "height": 844}  # a common phone's CSS viewport


async def test_every_page_fits_a_phone_screen(
    broker: Broker, tmp_path: Path, browser: Browser
) -> None:
    """Parents read the console on their phones: no page is wider than a phone's screen (a
    wide table scrolls inside its own box, the page itself never sideways)."""
    out = shots(tmp_path)
    async with lesson_rig(broker, tmp_path) as rig:
        base = await accounts(rig)
        lesson = await signals_run(rig, 10**12)
        pages: list[tuple[str, str, str]] = [
            ("mama", "/", "home-phone.png"),
            ("mama", f"/child/{rig.dev}", "child-phone.png"),
            ("mama", f"/child/{rig.dev}/lesson/{lesson}", "lesson-phone.png"),
            ("mama", f"/steer/{rig.dev}", "steer-phone.png"),
            ("ops", "/fleet", "fleet-phone.png"),
        ]
        for name, locale in (("mama", "zh-CN"), ("ops", "zh-CN"), ("mama", "en")):
            context = await browser.new_context(locale=locale, viewport=PHONE, base_url=base)
            page = await context.new_page()
            await page.goto("/login")
            zh = locale.startswith("zh")
            await page.get_by_label("用户名" if zh else "User name").fill(name)
            await page.get_by_label("密码" if zh else "Password").fill(PASSWORD)
            await page.keyboard.press("Enter")
            await expect(page).to_have_url(f"{base}/")
            for who, path, shot in pages:
                if who != name:
                    continue
                await page.goto(path)
                await expect(page.locator("main h1")).to_be_visible()
                width = await page.evaluate("document.documentElement.scrollWidth")
                # On a failure, say what sticks out (tables scroll inside their own box).
                wide = await page.evaluate(
                    "[...document.querySelectorAll('body *')]"
                    ".filter(e => e.getBoundingClientRect().right > innerWidth + 1"
                    " && !e.closest('table')).map(e => e.tagName).slice(0, 5)"
                )
                assert width <= PHONE["width"], (path, width, wide)
                name_en = shot if zh else shot.replace("-phone", "-phone-en")
                await page.screenshot(path=str(out / name_en), full_page=True)
            await context.close()
