"""topics.fastwire writes exactly the models' bytes, and hands back (None) what it does not handle."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.board import wire as board_wire
from topics import encode
from topics.backend import TASK_EVENT_ADAPTER
from topics.errors import PayloadError
from topics.fastwire import PARAMS_KEPT, ParamsCache, command_bytes, task_event_bytes
from topics.snlp_commands import COMMAND_ADAPTER

DEV = "aa_bb_cc_dd_ee_01"
TS = 1_764_574_000_000


def _model_command(cmd: str, params: dict[str, Any], **env: Any) -> bytes:
    obj = {"id": "c1", "ts": TS, "cmd": cmd, "params": params, "prio": 2, "ttl_ms": 5000} | env
    return encode(COMMAND_ADAPTER.validate_python(obj))


def _fast_command(cache: ParamsCache, cmd: str, params: dict[str, Any], **env: Any) -> bytes | None:
    e = {"id": "c1", "ts_ms": TS, "prio": 2, "ttl_ms": 5000} | env

    def encode_params() -> bytes:
        obj = {"id": "c1", "ts": TS, "cmd": cmd, "params": params, "prio": 2, "ttl_ms": 5000}
        return encode(COMMAND_ADAPTER.validate_python(obj).params)

    return command_bytes(cache, cmd, params, encode_params=encode_params, **e)


@pytest.mark.parametrize(
    ("cmd", "params"),
    [
        ("PLAY_MEDIA", {"name": "lesson/a.opus"}),
        ("PLAY_MEDIA", {"name": "学习/ä.opus", "repeat": 3, "volume": 40, "power_off_after": True}),
        ("LISTEN_START", {}),
        ("LISTEN_START", {"mode": "auto", "timeout_ms": 1800}),
        ("LISTEN_STOP", {}),
        ("ENSURE_APP_DIRS", {"app": "english"}),
        ("SOUND", {"type": "ding"}),
        ("WAIT", {"ms": 0}),
    ],
)
def test_command_bytes_equal_the_models(cmd: str, params: dict[str, Any]) -> None:
    cache: ParamsCache = {}
    expected = _model_command(cmd, params)
    assert _fast_command(cache, cmd, params) == expected
    assert _fast_command(cache, cmd, params) == expected  # from the cache
    assert len(cache) == 1


@pytest.mark.parametrize(
    ("cmd", "params", "env"),
    [
        ("PLAY_MEDIA", {"name": "a", "speed": 1.5}, {}),  # a float: the model path
        ("ENSURE_APP_DIRS", {"app": "a", "dirs": ["x"]}, {}),  # a list
        ("PLAY_MEDIA", {"name": "a"}, {"id": 'quo"te'}),
        ("PLAY_MEDIA", {"name": "a"}, {"id": "x" * 65}),
        ("PLAY_MEDIA", {"name": "a"}, {"ts_ms": -1}),
        ("PLAY_MEDIA", {"name": "a"}, {"prio": True}),
        ("PLAY_MEDIA", {"name": "a"}, {"prio": 4}),
        ("PLAY_MEDIA", {"name": "a"}, {"ttl_ms": 0}),
        ("PLAY\nMEDIA", {"name": "a"}, {}),
    ],
)
def test_commands_it_does_not_handle_go_the_model_path(
    cmd: str, params: dict[str, Any], env: dict[str, Any]
) -> None:
    assert _fast_command({}, cmd, params, **env) is None


def test_params_of_another_type_are_not_taken_from_the_cache() -> None:
    cache: ParamsCache = {}
    assert _fast_command(cache, "WAIT", {"ms": 1}) is not None
    with pytest.raises(ValueError, match="ms"):  # True == 1, but strict refuses a bool
        _fast_command(cache, "WAIT", {"ms": True})


def test_the_params_cache_is_bounded() -> None:
    cache: ParamsCache = {}
    for i in range(PARAMS_KEPT + 1):
        _fast_command(cache, "WAIT", {"ms": i})
    assert len(cache) == 1


def test_build_command_from_mapping_refuses_as_before() -> None:
    with pytest.raises(PayloadError):
        board_wire.build_command_from_mapping(
            "PLAY_MEDIA", {"name": ""}, id="c9", ts_ms=TS, prio=2, ttl_ms=5000
        )
    env = board_wire.build_command_from_mapping(
        "PLAY_MEDIA", {"name": "a"}, id="c9", ts_ms=TS, prio=2, ttl_ms=5000
    )
    assert env.payload == _model_command("PLAY_MEDIA", {"name": "a"}, id="c9")
    assert env.name == "PLAY_MEDIA"


def _model_event(event: str, inst: str | None, step: int | None, data: dict[str, Any]) -> bytes:
    obj = {"ts": TS, "device": DEV, "event": event, "instance_id": inst, "step_index": step}
    return encode(TASK_EVENT_ADAPTER.validate_python(obj | {"data": data}))


@pytest.mark.parametrize(
    ("event", "inst", "step", "data"),
    [
        ("window.opened", "i1", 2, {"planned_close_ms": TS, "window_ms": 1800}),
        (
            "window.closed",
            "i1",
            2,
            {"window_ms": 1800, "lateness_ms": -3, "actual_close_ms": TS, "planned_close_ms": TS},
        ),
        ("step.played", "i1", 0, {"clip": "a/b.opus", "ok": True, "n": 3, "none": None}),
        ("instance.completed", "i1", None, {}),
        ("instance.started", None, None, {"lesson": "", "x": "中文"}),
    ],
)
def test_task_event_bytes_equal_the_models(
    event: str, inst: str | None, step: int | None, data: dict[str, Any]
) -> None:
    if event == "instance.started":  # a non-ASCII value: the model path
        assert task_event_bytes(DEV, event, inst, step, data, ts_ms=TS) is None
        data = {"lesson": ""}
    expected = _model_event(event, inst, step, data)
    assert task_event_bytes(DEV, event, inst, step, data, ts_ms=TS) == expected


@pytest.mark.parametrize(
    ("dev", "event", "inst", "step", "data"),
    [
        ("AA", "step.played", "i1", 0, {}),
        (DEV, "step.played", "", 0, {}),
        (DEV, "step.played", "i1", -1, {}),
        (DEV, "step.played", "i1", 0, {"x": [1]}),
        (DEV, "step.played", "i1", 0, {"x": 1.5}),
        (DEV, "window.opened", "i1", 0, {"window_ms": 1}),
        (DEV, "window.opened", "i1", 0, {"window_ms": -1, "planned_close_ms": 1}),
        (DEV, "presence.changed", None, None, {"online": True}),
    ],
)
def test_task_events_it_does_not_handle_go_the_model_path(
    dev: str, event: str, inst: str | None, step: int | None, data: dict[str, Any]
) -> None:
    assert task_event_bytes(dev, event, inst, step, data, ts_ms=TS) is None
