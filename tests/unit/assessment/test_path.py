"""The assessment side path's own rules, driven through the pool's result callback."""

from __future__ import annotations

from gateway.assessment.jobs import (
    AnswerGrammar,
    AsrFailure,
    AsrKey,
    AsrOutcome,
    AsrResult,
    FailureReason,
)
from gateway.assessment.path import AssessmentPath
from gateway.http import HttpServer
from gateway.metrics import Metrics
from gateway.service import Context, Ops
from gateway.settings import AsrSettings, load_settings
from tests.support.fake_mqtt import FakePublisher

DEV = "aa_bb_cc_dd_ee_04"


class IdleBackend:
    """A backend the pool never opens here (the test delivers results itself)."""

    name = "idle"

    async def open_slot(self) -> object:
        raise AssertionError("not used")

    async def aclose(self) -> None:
        return None


class StepRows:
    """The store's step writes."""

    def __init__(self) -> None:
        self.rows: list[object] = []

    def submit_step(self, record: object) -> None:
        self.rows.append(record)


def _path(
    heard: list[object] | None = None, store: StepRows | None = None, asr: str = "pocketsphinx"
) -> tuple[AssessmentPath, FakePublisher, Metrics]:
    """``heard`` collects what the path tells the task runtime (``on_text``)."""
    metrics, mqtt = Metrics(), FakePublisher()
    http = HttpServer(host="127.0.0.1", port=0, metrics=metrics)
    ctx = Context(load_settings(), mqtt, http, metrics, Ops("gw", mqtt, metrics), http)  # type: ignore[arg-type]
    sink = heard if heard is not None else []
    path = AssessmentPath(
        ctx=ctx,
        settings=AsrSettings(engine=asr),  # type: ignore[arg-type]
        store=store,  # type: ignore[arg-type]
        on_text=lambda *a: sink.append(a),
        backend=None if asr == "none" else IdleBackend(),  # type: ignore[arg-type]
    )
    return path, mqtt, metrics


def _submit(
    path: AssessmentPath, utterance: str, methods: tuple[str, ...] = ("text_similarity_v0",)
) -> None:
    path.submit_utterance(
        device=DEV, instance_id="i1", step_index=1, utterance_id=utterance, pcm=b"\x00\x01" * 1600,
        prompt_text="/a/t/lessons/l/02.mp3", expected_text="How are you?", methods=methods,
        hints=(),
    )  # fmt: skip


def _result(utterance: str, text: str) -> AsrOutcome:
    return AsrOutcome(AsrKey("i1", 1, utterance), AsrResult(text, "idle", 1000.0, 50.0), 60.0)


async def test_an_older_utterance_finishing_later_is_discarded() -> None:
    path, mqtt, metrics = _path()
    _submit(path, "u-old")
    _submit(path, "u-new")
    path._on_result(_result("u-new", "how are you"))
    path._on_result(_result("u-old", "i like green apples"))  # was already running: too late
    (published,) = mqtt.bodies(f"/assessment/{DEV}")
    assert published["asr_text"] == "how are you"
    assert published["metrics"] == [{"method": "text_similarity_v0", "value": 1.0}]
    assert metrics.snapshot()["snlpgw_assessments_superseded_total"] == 1.0


async def test_failure_publishes_null_text_and_no_metrics_and_results_are_not_repeated() -> None:
    heard: list[object] = []
    path, mqtt, _ = _path(heard)
    _submit(path, "u1")
    failure = AsrFailure(FailureReason.ENGINE_ERROR, "boom")
    path._on_result(AsrOutcome(AsrKey("i1", 1, "u1"), failure, 10.0))
    path._on_result(AsrOutcome(AsrKey("i1", 1, "u1"), failure, 10.0))  # unknown now: ignored
    (published,) = mqtt.bodies(f"/assessment/{DEV}")
    assert published["asr_text"] is None
    assert published["metrics"] == []
    assert heard == []  # nothing to check for exit phrases


async def test_assessment_disabled_submits_nothing() -> None:
    path, mqtt, metrics = _path()
    _submit(path, "u1", methods=())
    assert (
        metrics.snapshot()['snlpgw_assessments_skipped_total{reason="assessment_disabled"}'] == 1.0
    )
    assert mqtt.sent == []


def _inline(path: AssessmentPath, utterance: str, texts: list[str | None]) -> bool:
    return path.transcribe_now(
        instance_id="i1", step_index=2, utterance_id=utterance, pcm=b"\x00\x01" * 1600,
        hints=(), on_text=texts.append, grammar=AnswerGrammar.NUMBER, max_wait_ms=4_000.0,
    )  # fmt: skip


async def test_an_inline_job_carries_its_grammar_and_wait_into_the_queue() -> None:
    path, _, _ = _path()
    assert _inline(path, "u1", [])
    assert path._pool is not None
    queued = path._pool._queue[("i1", 2)].job
    assert (queued.grammar, queued.max_wait_ms) == (AnswerGrammar.NUMBER, 4_000.0)


async def test_a_stopped_task_withdraws_its_queued_inline_job_and_hears_nothing() -> None:
    path, mqtt, metrics = _path()
    texts: list[str | None] = []
    assert _inline(path, "u1", texts)
    path.withdraw_inline(instance_id="i1", step_index=2, utterance_id="u1")
    assert path._pool is not None
    assert path._pool.depth == 0
    assert metrics.snapshot()['snlpgw_asr_jobs_dropped_total{reason="withdrawn"}'] == 1.0
    path._on_result(AsrOutcome(AsrKey("i1", 2, "u1"), AsrResult("two", "idle", 1.0, 1.0), 1.0))
    assert texts == []  # forgotten: a late result (e.g. one already running) is not delivered
    path.withdraw_inline(instance_id="i1", step_index=2, utterance_id="u1")  # twice: no-op
    assert metrics.snapshot()['snlpgw_asr_jobs_dropped_total{reason="withdrawn"}'] == 1.0
    assert mqtt.bodies(f"/assessment/{DEV}") == []


async def test_an_expired_inline_job_tells_its_waiter_none_without_an_alarm() -> None:
    path, mqtt, _ = _path()
    texts: list[str | None] = []
    assert _inline(path, "u1", texts)
    assert path._pool is not None
    job = path._pool._queue[("i1", 2)].job
    path._on_withdrawn(job)
    path._on_withdrawn(job)  # told once
    assert texts == [None]
    assert mqtt.sent == []  # no ops alarm, nothing published


async def test_a_window_shed_under_voice_overload_is_stored_counted_and_alarmed() -> None:
    rows = StepRows()
    path, mqtt, metrics = _path(store=rows)
    for step in (1, 2):
        path.shed_utterance(device=DEV, instance_id="i1", step_index=step,
                            reason="voice_overload", methods=("text_similarity_v0",))  # fmt: skip
    assert [(r.instance_id, r.step_index, r.assessment_shed) for r in rows.rows] == [  # type: ignore[attr-defined]
        ("i1", 1, "voice_overload"), ("i1", 2, "voice_overload"),
    ]  # fmt: skip
    assert all(r.asr_text is None and r.metrics == () for r in rows.rows)  # type: ignore[attr-defined]
    snap = metrics.snapshot()
    assert snap['snlpgw_assessments_shed_total{reason="voice_overload"}'] == 2.0
    (alarm,) = mqtt.bodies("/ops/gw/events")  # one alarm per 10 s however many are shed
    assert alarm["alarm"] == "voice_overload"
    assert mqtt.bodies(f"/assessment/{DEV}") == []


async def test_a_shed_window_without_assessment_is_only_counted_as_skipped() -> None:
    rows = StepRows()
    path, _, metrics = _path(store=rows)
    path.shed_utterance(device=DEV, instance_id="i1", step_index=1, reason="voice_overload",
                        methods=())  # fmt: skip
    off, _, off_metrics = _path(store=rows, asr="none")
    off.shed_utterance(device=DEV, instance_id="i1", step_index=1, reason="voice_overload",
                       methods=("text_similarity_v0",))  # fmt: skip
    assert rows.rows == []
    assert metrics.snapshot()['snlpgw_assessments_skipped_total{reason="assessment_disabled"}'] == 1
    assert off_metrics.snapshot()['snlpgw_assessments_skipped_total{reason="asr_off"}'] == 1


async def test_windows_claim_the_asr_room_and_a_refused_one_is_shed_as_asr_saturated() -> None:
    rows = StepRows()
    path, mqtt, metrics = _path(store=rows)  # queue_limit 32, the ASR idle: nothing measured
    assert all(path.claim_answer(f"dev{i}") for i in range(32))
    assert not path.claim_answer("dev32")  # every place is claimed by an open window
    path.release_answer("dev0")
    path.release_answer("dev0")  # released twice: nothing more
    assert path.claim_answer("dev32")
    snap = metrics.snapshot()
    assert snap['snlpgw_assessment_claims_total{outcome="kept"}'] == 33.0
    assert snap['snlpgw_assessment_claims_total{outcome="refused"}'] == 1.0
    path.shed_utterance(device=DEV, instance_id="i1", step_index=3, reason="asr_saturated",
                        methods=("text_similarity_v0",))  # fmt: skip
    assert [r.assessment_shed for r in rows.rows] == ["asr_saturated"]  # type: ignore[attr-defined]
    (alarm,) = mqtt.bodies("/ops/gw/events")  # the ASR's capacity, like the queue's sheds
    assert alarm["alarm"] == "asr_dropped"
    off, _, _ = _path(asr="none")
    assert all(off.claim_answer(f"dev{i}") for i in range(100))  # ASR off: decode as before
