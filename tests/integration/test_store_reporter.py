"""The manager reporter against real local aiohttp servers (and a port nobody listens on)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from gateway.service import Service
from gateway.store import (
    InstanceRecord,
    InstanceState,
    ManagerReporter,
    StepRecord,
    Store,
    StoredMetric,
)
from tests.unit.store.helpers import make_context, sample

pytestmark = pytest.mark.integration

SECRET = "s3cret-token"  # a test value


@dataclass
class Manager:
    """A real HTTP server recording PUTs; answers with ``statuses`` in turn, then 200."""

    statuses: list[int] = field(default_factory=list)
    puts: list[tuple[str, str | None, dict[str, object]]] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        async with self.changed:
            self.puts.append((request.path, request.headers.get("Authorization"), body))
            self.changed.notify_all()
        status = self.statuses.pop(0) if self.statuses else 200
        return web.json_response({"ok": status == 200}, status=status)

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        async with asyncio.timeout(10), self.changed:
            await self.changed.wait_for(predicate)


@pytest.fixture
async def manager() -> AsyncIterator[Manager]:
    mgr = Manager()
    app = web.Application()
    app.router.add_put("/api/task/instance/{instance_id}", mgr.handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    mgr.url = f"http://127.0.0.1:{port}/api"
    try:
        yield mgr
    finally:
        await runner.cleanup()


def free_port() -> int:
    """A port that was free a moment ago and has nobody listening (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@dataclass
class ReporterRig:
    service: Service
    store: Store
    reporter: ManagerReporter

    def value(self, name: str, **labels: str) -> float:
        return sample(self.service.metrics, name, **labels)


@pytest.fixture
def make_rig(tmp_path: Path) -> Callable[..., ReporterRig]:
    def build(url: str, **kwargs: object) -> ReporterRig:
        ctx = make_context(tmp_path)
        store = Store(path=tmp_path / "g.sqlite3", metrics=ctx.metrics, alarm=ctx.ops.alarm)
        reporter = ManagerReporter(
            store=store,
            url=url,
            secret=SECRET,
            metrics=ctx.metrics,
            alarm=ctx.ops.alarm,
            **kwargs,  # type: ignore[arg-type]
        )
        return ReporterRig(Service(ctx, [store, reporter]), store, reporter)

    return build


async def running(rig: ReporterRig, scenario: Callable[[], object]) -> None:
    async with asyncio.TaskGroup() as tg:
        tasks = [
            tg.create_task(rig.store.run(), name="test.store"),
            tg.create_task(rig.reporter.run(), name="test.reporter"),
        ]
        try:
            await scenario()  # type: ignore[misc]
        finally:
            for task in tasks:
                task.cancel()


def submit_lesson(store: Store, instance_id: str, steps: int) -> None:
    store.submit_instance(
        InstanceRecord(instance_id, device_id="dev1", state=InstanceState.RUNNING, created_ms=1)
    )
    for n in range(steps):
        store.submit_step(StepRecord(instance_id, n, prompt_text=f"/a/t/lessons/u/{n:02}.mp3"))
        store.submit_step(
            StepRecord(instance_id, n, metrics=(StoredMetric("text_similarity_v0", n / 10),))
        )
    store.submit_instance(InstanceRecord(instance_id, state=InstanceState.COMPLETED, ended_ms=9))


async def test_latest_snapshot_is_put_with_the_secret(
    manager: Manager, make_rig: Callable[..., ReporterRig]
) -> None:
    rig = make_rig(manager.url)

    async def scenario() -> None:
        submit_lesson(rig.store, "inst-1", steps=3)  # one burst: coalesced into one write
        await rig.store.flush()
        await manager.wait_for(lambda: len(manager.puts) >= 1)
        await rig.reporter.wait_idle()

    await running(rig, scenario)
    assert len(manager.puts) == 1
    path, auth, body = manager.puts[0]
    assert path == "/api/task/instance/inst-1"
    assert auth == f"Bearer {SECRET}"
    assert body["v"] == 1
    instance = body["instance"]
    assert isinstance(instance, dict)
    assert (instance["state"], instance["ended_ms"]) == ("completed", 9)
    steps = body["steps"]
    assert isinstance(steps, list)
    assert [s["metrics"] for s in steps] == [
        [{"method": "text_similarity_v0", "value": n / 10}] for n in range(3)
    ]
    assert rig.value("manager_puts_total", result="ok") == 1


async def test_each_committed_change_is_reported_in_its_latest_state(
    manager: Manager, make_rig: Callable[..., ReporterRig]
) -> None:
    rig = make_rig(manager.url)

    async def scenario() -> None:
        for n in range(5):
            await rig.store.upsert_instance(InstanceRecord("inst-2", current_step=n))
        await manager.wait_for(
            lambda: any(b["instance"]["current_step"] == 4 for _, _, b in manager.puts)  # type: ignore[index]
        )
        await rig.reporter.wait_idle()

    await running(rig, scenario)
    steps_seen = [b["instance"]["current_step"] for _, _, b in manager.puts]  # type: ignore[index]
    assert steps_seen[-1] == 4
    assert steps_seen == sorted(steps_seen)  # never an older snapshot after a newer one
    assert 1 <= len(steps_seen) <= 5


@pytest.mark.parametrize(
    ("status", "puts", "failed"),
    [(500, 2, 0), (401, 1, 1)],
    ids=["server-error-then-success-is-retried", "client-error-is-not-retried"],
)
async def test_a_refused_put_is_retried_only_after_a_server_error(
    manager: Manager, make_rig: Callable[..., ReporterRig], status: int, puts: int, failed: int
) -> None:
    manager.statuses = [status]  # the first answer; success after it
    rig = make_rig(manager.url, retries=3, backoff_s=0.01)

    async def scenario() -> None:
        submit_lesson(rig.store, "inst-3", steps=1)
        await rig.store.flush()
        await manager.wait_for(lambda: len(manager.puts) >= puts)
        await rig.reporter.wait_idle()

    await running(rig, scenario)
    assert len(manager.puts) == puts
    assert rig.value("manager_put_attempts_total") == puts
    assert rig.value("manager_puts_total", result="ok") == 1 - failed  # the one snapshot
    assert rig.value("manager_puts_total", result="failed") == failed
    assert rig.value("ops_alarms_total", alarm="manager_failed") == failed


async def test_unreachable_manager_never_holds_up_the_store(
    make_rig: Callable[..., ReporterRig],
) -> None:
    rig = make_rig(f"http://127.0.0.1:{free_port()}", retries=2, backoff_s=0.01)

    async def scenario() -> None:
        for n in range(3):
            submit_lesson(rig.store, f"inst-{n}", steps=2)
        await rig.store.flush()  # the store finishes whatever the manager does
        found = await rig.store.get_instance("inst-2")
        assert found is not None
        assert found[0].state is InstanceState.COMPLETED
        await rig.reporter.wait_idle()

    await running(rig, scenario)
    assert rig.value("manager_puts_total", result="failed") == 3
    assert rig.value("manager_put_attempts_total") == 9  # 1 + 2 retries each
    assert rig.value("ops_alarms_total", alarm="manager_failed") == 1  # rate-limited
    assert rig.value("store_write_failures_total") == 0


async def test_pending_instances_are_bounded_oldest_dropped(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    store = Store(path=tmp_path / "g.sqlite3", metrics=ctx.metrics, alarm=ctx.ops.alarm)
    reporter = ManagerReporter(
        store=store,
        url="http://127.0.0.1:9",
        secret=None,
        pending_limit=2,
        metrics=ctx.metrics,
        alarm=ctx.ops.alarm,
    )
    service = Service(ctx, [store, reporter])
    for n in range(5):
        reporter.notify(f"i{n}")
        reporter.notify(f"i{n}")  # coalesced
    assert reporter.pending == ["i3", "i4"]
    assert sample(service.metrics, "manager_dropped_total") == 3
    assert sample(service.metrics, "manager_pending") == 2
