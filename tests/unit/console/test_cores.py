"""The console's pure cores: language negotiation, every page text in both languages, the login
limiter and the progress plot."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from importlib.resources import files

import jinja2
import pytest

from gateway.console.alarms import RecentAlarms
from gateway.console.i18n import DEFAULT_LANG, MESSAGES, negotiate, text
from gateway.console.limiter import LoginLimiter
from gateway.console.plot import LABEL_MAX, MAX_SERIES, progress_svg
from gateway.store import StepRecord, StoredMetric


@pytest.mark.parametrize(
    ("cookie", "header", "expected"),
    [
        (None, None, "zh-CN"),
        (None, "", "zh-CN"),
        (None, "zh-CN,zh;q=0.9,en;q=0.8", "zh-CN"),
        (None, "zh-TW", "zh-CN"),
        (None, "en-US,en;q=0.9", "en"),
        (None, "en;q=0.5,zh;q=0.9", "zh-CN"),
        (None, "fr-FR,en;q=0.3", "en"),
        (None, "fr-FR,de", DEFAULT_LANG),
        (None, "zh;q=0,en", "en"),  # q=0: not Chinese
        (None, "en;q=0", "zh-CN"),  # only "not English": the default
        (None, "en;q=abc,zh;q=0.1", "zh-CN"),  # a bad quality counts as 0
        ("en", "zh-CN", "en"),  # the switch wins over the browser
        ("zh-CN", "en", "zh-CN"),
        ("xx", "en", "en"),  # an unknown cookie is ignored
    ],
)
def test_language_negotiation(cookie: str | None, header: str | None, expected: str) -> None:
    assert negotiate(cookie, header) == expected


def test_every_text_in_both_languages_and_every_template_key_exists() -> None:
    for key, (zh, en) in MESSAGES.items():
        assert zh, key
        assert en, key
        assert zh != en, key
        assert text(key, "en") == en
        assert text(key, "zh-CN") == zh
    used: set[str] = set()
    for template in (files("gateway.console") / "templates").iterdir():
        body = template.read_text(encoding="utf-8")
        used |= set(re.findall(r"""t\(["']([a-z_]+)["']\)""", body))
    used |= {f"role_{r}" for r in ("parent", "teacher", "operator")}
    used |= {f"state_{s}" for s in ("running", "paused", "completed", "cancelled")}
    missing = used - MESSAGES.keys()
    assert not missing
    with pytest.raises(KeyError):
        text("no_such_key", "en")


def test_limiter_refuses_after_failures_until_the_window_ends() -> None:
    limiter = LoginLimiter(max_failures=3, window_s=60.0)
    keys = ("addr:1.2.3.4", "user:mama")
    for i in range(3):
        assert not limiter.blocked(keys, now=float(i))
        limiter.failed(keys, now=float(i))
    assert limiter.blocked(keys, now=10.0)
    assert limiter.blocked(("user:mama",), now=59.0)  # the name alone, from any address
    assert not limiter.blocked(("addr:5.6.7.8", "user:papa"), now=10.0)
    assert not limiter.blocked(keys, now=60.0)  # window over: forgotten
    assert len(limiter) == 0


def test_limiter_success_clears_and_a_new_window_starts_after_the_old() -> None:
    limiter = LoginLimiter(max_failures=2, window_s=10.0)
    limiter.failed(("a",), now=0.0)
    limiter.succeeded(("a",))
    limiter.failed(("a",), now=1.0)
    assert not limiter.blocked(("a",), now=2.0)
    limiter.failed(("a",), now=20.0)  # the old window ended: this one counts 1
    assert not limiter.blocked(("a",), now=21.0)


def test_limiter_is_bounded() -> None:
    limiter = LoginLimiter(max_failures=1, window_s=60.0, max_keys=100)
    for i in range(1000):
        limiter.failed((f"addr:{i}",), now=0.0)
    assert len(limiter) == 100
    assert limiter.blocked(("addr:999",), now=1.0)
    assert not limiter.blocked(("addr:0",), now=1.0)  # evicted, oldest first
    with pytest.raises(ValueError, match="positive"):
        LoginLimiter(max_failures=0)


def test_plot_is_well_formed_escaped_and_bounded() -> None:
    series = {f"<lesson {i}>": [(1000.0 * j, float(j % 4)) for j in range(5)] for i in range(9)}
    svg = progress_svg(series, title="进度 & <title>", x_labels=("a", "b"))
    root = ET.fromstring(svg)  # noqa: S314 - our own markup; parses: escaped, closed tags
    assert root.get("role") == "img"
    assert root.get("aria-label") == "进度 & <title>"
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}polyline")) == MAX_SERIES
    assert len(root.findall(f"{ns}circle")) == MAX_SERIES * 5


def test_plot_of_one_point_and_of_nothing() -> None:
    one = ET.fromstring(progress_svg({"u1": [(5.0, 3.0)]}, title="t"))  # noqa: S314 - our own markup
    ns = "{http://www.w3.org/2000/svg}"
    assert one.findall(f"{ns}polyline") == []
    (dot,) = one.findall(f"{ns}circle")
    assert dot.get("cx") is not None
    empty = ET.fromstring(progress_svg({}, title="t"))  # noqa: S314 - our own markup
    assert empty.findall(f"{ns}circle") == []


def test_a_long_legend_label_is_shortened_and_whole_in_its_tooltip() -> None:
    long_label = "arithmetic_10/round1-with-a-long-name"
    series = {long_label: [(1.0, 2.0)], "u1": [(2.0, 1.0)]}
    svg = ET.fromstring(progress_svg(series, title="t"))  # noqa: S314 - our own markup
    ns = "{http://www.w3.org/2000/svg}"
    legend = []
    for node in svg.findall(f"{ns}text"):
        tip = node.find(f"{ns}title")
        if tip is not None:
            legend.append((tip.text, tip.tail))  # the tooltip, then what is shown
    assert legend == [(long_label, long_label[: LABEL_MAX - 1] + "…"), ("u1", "u1")]


def test_recent_alarms_are_bounded_per_device_and_in_devices() -> None:
    recent = RecentAlarms(per_device=2, max_devices=2)
    recent.raised("gateway_only", None, 1)
    assert len(recent) == 0
    recent.raised("a", "d1", 1)
    recent.raised("b", "d1", 2)
    recent.raised("c", "d1", 3)
    assert recent.of("d1") == ("c", "b")
    recent.raised("x", "d2", 4)
    recent.raised("d", "d1", 5)  # d1 heard last: d2 is now the least recent
    recent.raised("y", "d3", 6)
    assert len(recent) == 2
    assert recent.of("d2") == ()
    assert recent.of("d1") == ("d", "c")
    assert recent.of("d3") == ("y",)
    recent.raised("z" * 100, "d3", 7)
    assert recent.of("d3")[0] == "z" * 64
    with pytest.raises(ValueError, match="at least 1"):
        RecentAlarms(per_device=0)


@pytest.mark.parametrize("lang", ["zh-CN", "en"])
def test_a_step_shed_under_load_says_why_it_has_no_numbers_or_that_they_came_later(
    lang: str,
) -> None:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("gateway.console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    steps = [
        StepRecord("i1", 0, expected_text="Good morning.", assessment_shed="voice_overload"),
        StepRecord("i1", 1, expected_text="How are you?"),  # nothing said: no numbers, no why
        StepRecord("i1", 2, expected_text="Bye.", metrics=(StoredMetric("text_similarity_v0", 1),)),
        StepRecord(  # shed, then assessed from its recording by catch-up
            "i1",
            3,
            expected_text="Thank you.",
            assessment_shed="asr_saturated",
            assessed_at=9,
            metrics=(StoredMetric("text_similarity_v0", 0.5),),
        ),
        StepRecord(  # shed, then assessed: nothing heard in the recording
            "i1",
            4,
            expected_text="See you.",
            assessment_shed="queue_full",
            assessed_at=9,
        ),
    ]
    html = env.get_template("steps.html").render(
        t=lambda key: text(key, lang), rows=[(s, None, None) for s in steps],
        with_signals=False, with_audio=False,
    )  # fmt: skip
    cells = re.findall(r"<td>(.*?)</td>", html, re.S)
    numbers = [c for c in cells if "text_similarity" in c or text("no_numbers", lang) in c
               or text("not_assessed_busy", lang) in c]  # fmt: skip
    assert [text("not_assessed_busy", lang) in c for c in numbers] == [True] + [False] * 4
    assert [text("assessed_later", lang) in c for c in numbers] == [False] * 3 + [True] * 2
    assert "text_similarity_v0: 1.00" in numbers[2]
    assert "text_similarity_v0: 0.50" in numbers[3]
    assert text("no_numbers", lang) in numbers[4]
