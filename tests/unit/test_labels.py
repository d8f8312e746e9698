"""Device strings map to a fixed label set plus ``other``."""

from __future__ import annotations

import pytest

from gateway import labels


@pytest.mark.parametrize(
    ("value", "expected"),
    [("PLAY_MEDIA", "PLAY_MEDIA"), ("X" * 7800, "other"), (None, "none"), ("play_media", "other")],
)
def test_bounded_commands(value: str | None, expected: str) -> None:
    assert labels.bounded(value, labels.COMMANDS) == expected


@pytest.mark.parametrize(
    ("evt", "expected"),
    [
        ("audio.completed", "audio.completed"),
        ("button", "button"),
        ("app_task.step_done", "app_task"),
        ("app_task.ffffffff-1234", "app_task"),
        ("audio.completed-1", "other"),
        ("evt-" + "a" * 100, "other"),
    ],
)
def test_board_event_labels(evt: str, expected: str) -> None:
    assert labels.board_event(evt) == expected


def test_label_sets_come_from_the_contract_and_runtime() -> None:
    assert {"PLAY_MEDIA", "LISTEN_STOP", "TASK_STOP"} <= labels.COMMANDS
    assert {"CommandOutcome", "audio.stopped"} <= labels.RUNTIME_EVENTS
    assert {"watchdog", "play_failed", "audio.failed"} <= labels.STEP_FAILURES


def test_upstream_message_types_are_bounded_too() -> None:
    assert labels.bounded("tts", labels.XIAOZHI_SERVER_TYPES) == "tts"
    assert labels.bounded("tts" + "x" * 50, labels.XIAOZHI_SERVER_TYPES) == "other"
