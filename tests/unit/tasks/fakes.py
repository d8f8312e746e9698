"""Hand-written fakes at the task shell's edges (STYLE: fakes only for shell unit tests), and
the task service running over them (:func:`running_tasks`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.http import HttpServer
from gateway.metrics import Metrics
from gateway.service import Context, Ops
from gateway.settings import load_settings
from gateway.tasks.core import (
    AudioPhase,
    DeliveryResult,
    InstanceColumns,
    PlaybackEvent,
    RuntimeConfig,
    StepColumns,
    load_catalog,
    resource_reader,
)
from gateway.tasks.inbox import TaskInbox
from gateway.tasks.service import TaskService
from tests.support.fake_mqtt import FakePublisher

CATALOG = Path(__file__).parents[3] / "catalog"


@dataclass
class FakeBoard:
    """Acks every command at once; 'plays' PLAY_MEDIA for ``clip_ms`` then reports completion."""

    clip_ms: int = 50
    sink: Callable[[str, PlaybackEvent], None] | None = None
    sent: list[tuple[float, str, str, Mapping[str, object]]] = field(default_factory=list)
    fail_names: set[str] = field(default_factory=set)

    def send_command(
        self,
        device: str,
        *,
        command_id: str,
        cmd: str,
        params: Mapping[str, object],
        prio: int,
        on_outcome: Callable[[DeliveryResult], None],
    ) -> None:
        loop = asyncio.get_running_loop()
        self.sent.append((loop.time() * 1000, cmd, command_id, params))
        on_outcome(DeliveryResult.ACKED)
        if cmd == "PLAY_MEDIA":
            name = str(params["name"])
            kind = AudioPhase.FAILED if name in self.fail_names else AudioPhase.COMPLETED
            event = PlaybackEvent(kind, command_id, name, self.clip_ms)
            loop.call_later(self.clip_ms / 1000, self._emit, device, event)

    def _emit(self, device: str, event: PlaybackEvent) -> None:
        assert self.sink is not None
        self.sink(device, event)

    def times_of(self, cmd: str) -> list[float]:
        return [t for t, c, _, _ in self.sent if c == cmd]


@dataclass
class FakeMic:
    """Records listening changes; ``capture``: the packets the next closed sheddable window
    hands back (as a channel under voice overload does), None: the loop admits windows, which
    are then decoded unless their ``claim`` refuses (``unclaimed`` handed back)."""

    calls: list[tuple[str, bool]] = field(default_factory=list)
    sheddable: list[bool] = field(default_factory=list)
    capture: tuple[bytes, ...] | None = None
    unclaimed: tuple[bytes, ...] = (b"\xf8\xff\xfe",)
    _captured: dict[str, tuple[bytes, ...]] = field(default_factory=dict)

    def set_listening(
        self,
        device: str,
        listening: bool,
        *,
        sheddable: bool = False,
        claim: Callable[[], bool] | None = None,
    ) -> None:
        self.calls.append((device, listening))
        self.sheddable.append(sheddable)
        if not (listening and sheddable):
            return
        if self.capture is not None:
            self._captured[device] = self.capture
        elif claim is not None and not claim():
            self._captured[device] = self.unclaimed

    def take_captured(self, device: str) -> tuple[bytes, ...] | None:
        return self._captured.pop(device, None)


@dataclass
class FakeRecorder:
    instances: list[InstanceColumns] = field(default_factory=list)
    steps: list[StepColumns] = field(default_factory=list)

    def save_instance(self, record: InstanceColumns) -> None:
        self.instances.append(record)

    def save_step(self, record: StepColumns) -> None:
        self.steps.append(record)


@dataclass
class FakeAssessment:
    """``refuse_first``: that many claims refused first (the ASR saturated), then kept."""

    submitted: list[dict[str, Any]] = field(default_factory=list)
    shed: list[dict[str, Any]] = field(default_factory=list)
    claims: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    refuse_first: int = 0

    def claim_answer(self, device: str) -> bool:
        self.claims.append(device)
        return len(self.claims) > self.refuse_first

    def release_answer(self, device: str) -> None:
        self.released.append(device)

    def submit_utterance(self, **job: Any) -> None:
        self.submitted.append(job)

    def shed_utterance(self, **job: Any) -> None:
        self.shed.append(job)


@contextlib.asynccontextmanager
async def running_tasks(
    catalog: Path,
    mqtt: FakePublisher,
    metrics: Metrics,
    board: FakeBoard,
    *,
    min_window_ms: int,
    present: Sequence[str] = (),
    **parts: Any,
) -> AsyncIterator[TaskService]:
    """The task service over these fakes, running (restored) until the block exits; the
    board's events go to its inbox; ``present``: devices online before it starts; ``parts``:
    the rest of its collaborators (mic, recorder, assessment, ownership)."""
    http = HttpServer(host="127.0.0.1", port=0, metrics=metrics)
    ctx = Context(load_settings(), mqtt, http, metrics, Ops("gw", mqtt, metrics), http)  # type: ignore[arg-type]
    inbox = TaskInbox(metrics=metrics)
    svc = TaskService(
        ctx=ctx,
        inbox=inbox,
        catalog=load_catalog(catalog).catalog,
        config=RuntimeConfig(min_window_ms=min_window_ms),
        read_text=resource_reader(CATALOG / "resources"),
        commands=board,
        **parts,
    )
    board.sink = inbox.board_event
    for device in present:
        svc.on_presence(device, True)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(svc.run(), name="test.tasks")
        await svc.wait_ready()
        yield svc
        task.cancel()
