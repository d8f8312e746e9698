"""Every message type survives model → bytes → model, and its bytes match its JSON Schema."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import jsonschema
import pytest

from devstack.asyncapi import MESSAGES, generate
from topics import (
    Command,
    ServerHello,
    TopicKind,
    command,
    encode,
    encode_board_message,
    encode_command,
    encode_xiaozhi,
    parse_board_message,
    parse_ctl_request,
    parse_xiaozhi_downlink,
)
from topics.snlp_commands import TaskControl, Wait

from .samples import DEV, SAMPLES, Sample


@cache
def _schemas() -> dict[str, dict[str, Any]]:
    files = generate()
    return {m.name: json.loads(files[f"schemas/{m.name}.json"]) for m in MESSAGES}


def test_every_schema_has_a_sample() -> None:
    assert {s.schema for s in SAMPLES} == {m.name for m in MESSAGES}


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.id)
def test_round_trip(sample: Sample) -> None:
    wire = encode(sample.model)
    compact = json.dumps(json.loads(wire), separators=(",", ":"), ensure_ascii=False)
    assert wire == compact.encode()
    assert sample.parse(wire) == sample.model
    assert encode(sample.parse(wire)) == wire  # type: ignore[arg-type]


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.id)
def test_bytes_match_schema(sample: Sample) -> None:
    jsonschema.Draft202012Validator(_schemas()[sample.schema]).validate(
        json.loads(encode(sample.model))
    )


def test_optional_fields_are_omitted_but_required_nulls_are_kept() -> None:
    by_id = {s.id: s for s in SAMPLES}
    event = json.loads(encode(by_id["evt.audio_failed_code"].model))
    assert event["ref"] is None
    assert "id" not in event
    assert "ts" not in event
    assessment = json.loads(encode(by_id["assessment.unassessed"].model))
    assert assessment["expected_text"] is None
    assert assessment["asr_text"] is None
    assert "clip" not in assessment
    assert assessment["metrics"] == []


def test_spec_example_event_parses() -> None:
    wire = (
        b'{"v":1,"id":"e1","ts":1764460800123,"ref":"c1","evt":"audio.completed","data":'
        b'{"name":"/english_learning/shadowing/lessons/unit01/01.mp3","duration_ms":2140,"reason":"eof"}}'
    )
    by_id = {s.id: s for s in SAMPLES}
    event = by_id["evt.audio.completed"].parse(wire)
    assert event.data.duration_ms == 2140  # type: ignore[attr-defined]
    assert event.ref == "c1"  # type: ignore[attr-defined]


def test_typed_encoders_and_parsers_agree() -> None:
    by_id = {s.id: s for s in SAMPLES}
    cmd = by_id["cmd.play_media"].model
    assert isinstance(cmd, Command)
    assert encode_command(cmd) == encode(cmd)
    assert parse_board_message(TopicKind.CMD, encode_command(cmd)) == cmd
    assert encode_board_message(cmd) == encode(cmd)
    hello = by_id["xiaozhi.down.hello"].model
    assert isinstance(hello, ServerHello)
    assert parse_xiaozhi_downlink(encode_xiaozhi(hello)) == hello
    ctl = by_id["ctl.start"].model
    assert parse_ctl_request(encode(ctl)) == ctl


def test_command_builder_picks_the_envelope() -> None:
    stop = command(
        TaskControl(app="a", task="t"), id="c", ts=0, prio=3, ttl_ms=1, task_verb="TASK_STOP"
    )
    assert stop.cmd == "TASK_STOP"
    assert command(Wait(ms=5), id="c", ts=0, prio=1, ttl_ms=1).cmd == "WAIT"
    with pytest.raises(ValueError, match="task_verb"):
        command(TaskControl(app="a", task="t"), id="c", ts=0, prio=3, ttl_ms=1)
    with pytest.raises(ValueError, match="task_verb"):
        command(Wait(ms=5), id="c", ts=0, prio=1, ttl_ms=1, task_verb="TASK_STOP")


@pytest.mark.parametrize(
    ("schema", "body"),
    [
        ("snlpgw.ctl_request", {"v": 1, "id": "r1", "action": "start", "app_id": "a"}),
        ("snlpgw.ctl_reply", {"v": 1, "ref": "r", "device": DEV, "action": None, "status": "refused", "ts": 1}),
        ("snlpgw.ctl_reply", {"v": 1, "ref": "r", "device": DEV, "action": None, "status": "accepted", "reason": "busy", "ts": 1}),
        ("snlp.report", {"ref": "c", "stage": "done"}),
        ("snlp.event", {"evt": "audio.completed", "data": {"duration_ms": -1}}),
        ("snlp.command", {"v": 1, "id": "c", "ts": 0, "cmd": "NOPE", "params": {}, "prio": 1, "ttl_ms": 1}),
    ],
)  # fmt: skip
def test_schemas_reject_what_the_models_reject(schema: str, body: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(_schemas()[schema]).validate(body)
