"""The results HTTP API on the admin listener (read-only), over the read model in
``results.py``:

* ``GET /results/devices/{device}/history`` — instances with steps (reference text,
  transcript, metrics, behaviour signals) and each run's signals, newest first;
* ``GET /results/devices/{device}/progress`` — each lesson's runs over time with its
  metrics' means;
* ``GET /results/devices/{device}/export.json`` and ``.csv`` — one flat row per step.

Query (all optional): ``since_ms``, ``until_ms`` (epoch ms, instance creation, half-open) and
``limit`` (instances, 1..500). Errors as the task API: 400 bad query, 503 store unavailable,
body ``{"error", "detail"}``. A device with no instances is an empty answer, not a 404 (the
gateway does not know which ids exist elsewhere, and an empty record is a true answer).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from gateway.http import HttpServer
from gateway.openapi import QueryParam, RouteDoc
from gateway.store.api import ID_PATTERN
from gateway.store.assessments import StepAssessment
from gateway.store.errors import StoreError
from gateway.store.records import StepRecord
from gateway.store.results import (
    MAX_HISTORY,
    DeviceHistory,
    InstanceHistory,
    LessonProgress,
    RunSignals,
    device_history,
    export_columns,
    export_rows,
    lesson_progress,
    metric_methods,
    rows_to_csv,
    run_signals,
)
from gateway.store.store import Store

log = logging.getLogger(__name__)
DEFAULT_RESULTS_LIMIT = 50
_MS_MAX = 2**62


class ResultsMetric(BaseModel):
    model_config = ConfigDict(extra="forbid")
    method: str
    value: float


class ResultsReassessment(BaseModel):
    """The step's archived answer re-run by one engine version (``snlpgw reassess``)."""

    model_config = ConfigDict(extra="forbid")
    engine: str
    engine_version: str
    asr_text: str | None
    metrics: list[ResultsMetric]
    assessed_ms: int


class ResultsStep(BaseModel):
    """One step: what was played and expected, what the child said, the numbers."""

    model_config = ConfigDict(extra="forbid")
    step_index: int
    clip: str | None
    prompt_text: str | None
    expected_text: str | None
    asr_text: str | None
    metrics: list[ResultsMetric]
    assessed_at: int | None
    played_ms: int | None
    completed_ms: int | None
    window_opened_ms: int | None
    window_closed_ms: int | None
    failure: str | None
    assessment_shed: str | None
    audio_id: str | None
    audio_url: str | None  # a short-lived signed link on this listener (null: nothing kept)
    reassessments: list[ResultsReassessment]
    # behaviour signals (STEPS tasks; null on clip-stepped lessons): window open -> speech start
    # (null: nothing said), and 1 when the step ran to its end with a transcript, 0 cut short
    response_latency_ms: int | None
    step_completed: int | None


class ResultsSignals(BaseModel):
    """A run's behaviour signals, derived from its steps' (numbers, never a diagnosis):
    steps carrying a signal, how many the child answered (speech started), how many ran to
    their end, and the mean and median response latency over the answered ones."""

    model_config = ConfigDict(extra="forbid")
    steps: int
    responded: int
    completed: int
    mean_latency_ms: float | None
    median_latency_ms: float | None


class ResultsInstance(BaseModel):
    """One lesson run with its steps."""

    model_config = ConfigDict(extra="forbid")
    instance_id: str
    app_id: str | None
    task_id: str | None
    lesson_id: str | None
    mode: str | None
    priority: int | None
    source: str | None
    state: str | None
    reason: str | None
    created_ms: int | None
    ended_ms: int | None
    signals: ResultsSignals | None  # null: no step of the run carries a signal
    steps: list[ResultsStep]


class ResultsHistory(BaseModel):
    model_config = ConfigDict(extra="forbid")
    device: str
    truncated: bool
    instances: list[ResultsInstance]


class ResultsMetricMean(BaseModel):
    model_config = ConfigDict(extra="forbid")
    method: str
    mean: float
    count: int


class ResultsProgressPoint(BaseModel):
    model_config = ConfigDict(extra="forbid")
    instance_id: str
    created_ms: int | None
    ended_ms: int | None
    state: str | None
    steps: int
    steps_assessed: int
    metrics: list[ResultsMetricMean]
    signals: ResultsSignals | None  # the run's behaviour signals (null: none stored)


class ResultsLesson(BaseModel):
    model_config = ConfigDict(extra="forbid")
    app_id: str | None
    task_id: str | None
    lesson_id: str | None
    points: list[ResultsProgressPoint]


class ResultsProgress(BaseModel):
    model_config = ConfigDict(extra="forbid")
    device: str
    truncated: bool
    lessons: list[ResultsLesson]


class ResultsExport(BaseModel):
    """Flat rows: the fixed columns (the step's signals among them), the run's signal columns
    (``run_*``), then ``metric:<method>`` for each method present."""

    model_config = ConfigDict(extra="forbid")
    device: str
    truncated: bool
    columns: list[str]
    rows: list[dict[str, str | int | float | None]]


class BadResultsQuery(ValueError):
    pass


def parse_results_query(query: dict[str, str]) -> tuple[int | None, int | None, int]:
    """``since_ms``, ``until_ms``, ``limit`` (others ignored); raises :class:`BadResultsQuery`."""

    def ms(name: str) -> int | None:
        raw = query.get(name)
        if raw is None:
            return None
        if not raw.isdigit() or int(raw) >= _MS_MAX:
            raise BadResultsQuery(f"{name}: expected epoch milliseconds (a non-negative integer)")
        return int(raw)

    since, until = ms("since_ms"), ms("until_ms")
    if since is not None and until is not None and until <= since:
        raise BadResultsQuery("until_ms must be after since_ms")
    limit = DEFAULT_RESULTS_LIMIT
    if "limit" in query:
        raw = query["limit"]
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_HISTORY:
            raise BadResultsQuery(f"limit: expected an integer 1..{MAX_HISTORY}")
        limit = int(raw)
    return since, until, limit


def signals_model(signals: RunSignals | None) -> ResultsSignals | None:
    if signals is None:
        return None
    return ResultsSignals(
        steps=signals.steps,
        responded=signals.responded,
        completed=signals.completed,
        mean_latency_ms=signals.mean_latency_ms,
        median_latency_ms=signals.median_latency_ms,
    )


AudioLinks = Callable[[str], str]  # audio_id -> signed path on the admin listener


def step_model(
    step: StepRecord,
    again: tuple[StepAssessment, ...] = (),
    links: AudioLinks | None = None,
) -> ResultsStep:
    return ResultsStep(
        step_index=step.step_index,
        clip=step.clip,
        prompt_text=step.prompt_text,
        expected_text=step.expected_text,
        asr_text=step.asr_text,
        metrics=[ResultsMetric(method=m.method, value=m.value) for m in step.metrics],
        assessed_at=step.assessed_at,
        played_ms=step.played_ms,
        completed_ms=step.completed_ms,
        window_opened_ms=step.window_opened_ms,
        window_closed_ms=step.window_closed_ms,
        failure=step.failure,
        assessment_shed=step.assessment_shed,
        audio_id=step.audio_id,
        audio_url=links(step.audio_id) if links is not None and step.audio_id else None,
        reassessments=[
            ResultsReassessment(
                engine=r.engine,
                engine_version=r.engine_version,
                asr_text=r.asr_text,
                metrics=[ResultsMetric(method=m.method, value=m.value) for m in r.metrics],
                assessed_ms=r.assessed_ms,
            )
            for r in again
        ],
        response_latency_ms=step.response_latency_ms,
        step_completed=step.step_completed,
    )


def instance_model(run: InstanceHistory, links: AudioLinks | None = None) -> ResultsInstance:
    i = run.instance
    return ResultsInstance(
        instance_id=i.instance_id,
        app_id=i.app_id,
        task_id=i.task_id,
        lesson_id=i.lesson_id,
        mode=i.mode,
        priority=i.priority,
        source=i.source,
        state=None if i.state is None else i.state.value,
        reason=i.reason,
        created_ms=i.created_ms,
        ended_ms=i.ended_ms,
        signals=signals_model(run_signals(run.steps)),
        steps=[step_model(s, run.reassessed(s.step_index), links) for s in run.steps],
    )


def progress_model(history: DeviceHistory, lessons: tuple[LessonProgress, ...]) -> ResultsProgress:
    return ResultsProgress(
        device=history.device,
        truncated=history.truncated,
        lessons=[
            ResultsLesson(
                app_id=lesson.app_id,
                task_id=lesson.task_id,
                lesson_id=lesson.lesson_id,
                points=[
                    ResultsProgressPoint(
                        instance_id=p.instance_id,
                        created_ms=p.created_ms,
                        ended_ms=p.ended_ms,
                        state=p.state,
                        steps=p.steps,
                        steps_assessed=p.steps_assessed,
                        metrics=[
                            ResultsMetricMean(method=m.method, mean=m.mean, count=m.count)
                            for m in p.metrics
                        ],
                        signals=signals_model(p.signals),
                    )
                    for p in lesson.points
                ],
            )
            for lesson in lessons
        ],
    )


def _error(status: int, code: str, detail: str) -> web.Response:
    return web.json_response({"error": code, "detail": detail}, status=status)


_QUERY = (
    QueryParam("since_ms", "instances created at or after (epoch ms)", {"type": "integer"}),
    QueryParam("until_ms", "instances created before (epoch ms)", {"type": "integer"}),
    QueryParam(
        "limit",
        f"at most this many instances, newest first (1..{MAX_HISTORY})",
        {"type": "integer", "default": DEFAULT_RESULTS_LIMIT},
    ),
)
_HISTORY_DOC = RouteDoc(
    summary=(
        "A device's lesson runs with every step's reference, transcript, metrics and "
        "behaviour signals"
    ),
    tag="results",
    query=_QUERY,
    response=ResultsHistory,
    errors=(400, 503),
)
_PROGRESS_DOC = RouteDoc(
    summary="A device's progress per lesson over time (each run's metric means and signals)",
    tag="results",
    query=_QUERY,
    response=ResultsProgress,
    errors=(400, 503),
)
_EXPORT_JSON_DOC = RouteDoc(
    summary="A device's results as flat rows (one per step), JSON",
    tag="results",
    query=_QUERY,
    response=ResultsExport,
    errors=(400, 503),
)
_EXPORT_CSV_DOC = RouteDoc(
    summary="A device's results as CSV (one row per step, a header line)",
    tag="results",
    query=_QUERY,
    content_type="text/csv",
    errors=(400, 503),
)


class ResultsApi:
    """Routes only, on the admin listener given at construction."""

    def __init__(
        self, *, store: Store, admin: HttpServer, audio_links: AudioLinks | None = None
    ) -> None:
        """``audio_links``: the archive's link signer (None: no archive, no links)."""
        self._store = store
        self.audio_links = audio_links
        base = "/results/devices/{device}"
        admin.add_route("GET", f"{base}/history", self.history, _HISTORY_DOC)
        admin.add_route("GET", f"{base}/progress", self.progress, _PROGRESS_DOC)
        admin.add_route("GET", f"{base}/export.json", self.export_json, _EXPORT_JSON_DOC)
        admin.add_route("GET", f"{base}/export.csv", self.export_csv, _EXPORT_CSV_DOC)

    async def _read(self, request: web.Request) -> DeviceHistory | web.Response:
        device = request.match_info["device"]
        if not ID_PATTERN.fullmatch(device):
            return _error(400, "bad_request", "device: expected 1-128 of [A-Za-z0-9_.:-]")
        try:
            since, until, limit = parse_results_query(dict(request.query))
        except BadResultsQuery as exc:
            return _error(400, "bad_request", str(exc))
        try:
            return await device_history(
                self._store, device, since_ms=since, until_ms=until, limit=limit
            )
        except StoreError as exc:
            log.warning("results API read failed: %s", exc)
            return _error(503, "store_unavailable", "the store cannot be read")

    async def history(self, request: web.Request) -> web.Response:
        found = await self._read(request)
        if isinstance(found, web.Response):
            return found
        body = ResultsHistory(
            device=found.device,
            truncated=found.truncated,
            instances=[instance_model(run, self.audio_links) for run in found.instances],
        )
        return web.json_response(body.model_dump(mode="json"))

    async def progress(self, request: web.Request) -> web.Response:
        found = await self._read(request)
        if isinstance(found, web.Response):
            return found
        return web.json_response(progress_model(found, lesson_progress(found)).model_dump())

    async def export_json(self, request: web.Request) -> web.Response:
        found = await self._read(request)
        if isinstance(found, web.Response):
            return found
        body = ResultsExport(
            device=found.device,
            truncated=found.truncated,
            columns=list(export_columns(metric_methods(found))),
            rows=export_rows(found),
        )
        return web.json_response(body.model_dump(mode="json"))

    async def export_csv(self, request: web.Request) -> web.Response:
        found = await self._read(request)
        if isinstance(found, web.Response):
            return found
        text = rows_to_csv(export_rows(found), metric_methods(found))
        name = f"results-{found.device}.csv"
        return web.Response(
            text=text,
            content_type="text/csv",
            charset="utf-8",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )
