"""Window formula, watchdog, priorities and exit-phrase matching."""

from __future__ import annotations

import pytest

from gateway.settings import RuntimeSettings
from gateway.tasks.core import RuntimeConfig, clamp_ratio, contains_exit_phrase, listen_window_ms
from gateway.tasks.core.rules import normalise, preempts


@pytest.mark.parametrize(
    ("ratio", "duration_ms", "min_window_ms", "expected"),
    [
        (1.0, 2000, 800, 2400.0),  # below range -> 1.2
        (1.2, 2000, 800, 2400.0),
        (1.35, 2000, 800, 2700.0),  # inside
        (1.5, 2000, 800, 3000.0),
        (3.0, 2000, 800, 3000.0),  # above range -> 1.5
        (0.1, 10_000, 800, 12_000.0),
        (1.5, 100, 800, 800.0),  # tiny clip hits min_window_ms
        (1.2, 666, 800, 800.0),  # 799.2 -> 800
        (1.2, 667, 800, 800.4),  # just over
        (1.2, 0, 800, 800.0),
        (1.2, -50, 800, 800.0),  # nonsense duration counts as 0
        (1.2, 500, 0, 600.0),  # no minimum configured
    ],
)
def test_window_formula(
    ratio: float, duration_ms: int, min_window_ms: int, expected: float
) -> None:
    assert listen_window_ms(duration_ms, ratio, min_window_ms) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("ratio", "clamped"), [(0.5, 1.2), (1.2, 1.2), (1.4, 1.4), (1.5, 1.5), (9, 1.5)]
)
def test_clamp_ratio(ratio: float, clamped: float) -> None:
    assert clamp_ratio(ratio) == clamped


@pytest.mark.parametrize(
    ("duration", "repeat", "expected"),
    [
        (None, 1, 120_000.0),
        (0, 1, 120_000.0),
        (2000, 1, 7000.0),
        (2000, 3, 11_000.0),
        (2000, 0, 7000.0),
    ],
)
def test_watchdog(duration: int | None, repeat: int, expected: float) -> None:
    assert RuntimeConfig().watchdog_ms(duration, repeat) == expected


@pytest.mark.parametrize(
    ("requested", "running", "wins"),
    [(3, 3, True), (3, 1, True), (2, 3, False), (1, 2, False), (2, 2, True)],
)
def test_preempts(requested: int, running: int, wins: bool) -> None:
    assert preempts(requested, running) is wins


@pytest.mark.parametrize(
    ("text", "hit"),
    [
        ("Stop the lesson", True),
        ("please, STOP  the lesson!", True),
        ("stopthelesson now", True),
        ("stop lesson", False),
        ("我要退出。", True),
        ("退 出", True),
        ("", False),
        ("good morning", False),
    ],
)
def test_exit_phrase_is_normalised_containment(text: str, hit: bool) -> None:
    assert contains_exit_phrase(text, ("stop the lesson", "退出")) is hit


def test_blank_phrase_never_matches() -> None:
    assert not contains_exit_phrase("anything", ("", "!!"))
    assert normalise("\uff27ood  Morning, Sir!")  # fullwidth G (NFKC) == "goodmorningsir"


def test_config_from_settings() -> None:
    cfg = RuntimeConfig.from_settings(RuntimeSettings(offline_grace_s=2.5, exit_phrases=("bye",)))
    assert cfg.offline_grace_ms == 2500.0
    assert cfg.exit_phrases == ("bye",)
    assert cfg.min_window_ms == 800
