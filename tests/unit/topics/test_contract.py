"""The generated contract: no drift, valid schemas, no verdict fields, every topic documented."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import ValidationError

from devstack.asyncapi import CHANNELS, HERE, drift, main, write
from devstack.asyncapi import generate as _generate
from gateway.metrics import Metrics
from gateway.mqtt.edge import presence_payload
from topics import GatewayStatus, OpsMetrics, TopicKind, build_topic, parse_snlpgw
from topics.snlp_commands import PlayMedia

FORBIDDEN = {
    "passed", "pass", "failed_check", "grade", "level", "good", "bad", "score_verdict",
    "verdict", "retry_count", "retries_left", "correct", "is_correct", "threshold", "ok_to_advance",
}  # fmt: skip


@cache
def generate() -> dict[str, str]:
    return _generate()


def test_checked_in_files_match_the_models() -> None:
    assert drift() == [], "run: python -m devstack.asyncapi --write"
    assert main(["--check"]) == 0


def test_check_detects_drift_and_write_repairs_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--check"], root=tmp_path) == 1  # nothing written yet
    assert main(["--write"], root=tmp_path) == 0
    assert drift(tmp_path) == []
    assert main(["--check"], root=tmp_path) == 0
    (tmp_path / "schemas/snlp.ack.json").write_text("{}\n")
    (tmp_path / "schemas/old.json").write_text("{}\n")
    assert drift(tmp_path) == ["schemas/old.json", "schemas/snlp.ack.json"]
    capsys.readouterr()
    assert main(["--check"], root=tmp_path) == 1
    assert "topics/schemas/old.json" in capsys.readouterr().err
    write(tmp_path)
    assert drift(tmp_path) == []
    assert not (tmp_path / "schemas/old.json").exists()


def test_generation_is_deterministic() -> None:
    assert _generate() == _generate()


def _property_names(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                yield from value
            yield from _property_names(value)
    elif isinstance(node, list):
        for item in node:
            yield from _property_names(item)


@pytest.mark.parametrize("path", sorted(p for p in generate() if p.endswith(".json")))
def test_schema_is_valid_and_has_no_verdict_fields(path: str) -> None:
    schema = json.loads(generate()[path])
    jsonschema.Draft202012Validator.check_schema(schema)
    names = set(_property_names(schema))
    assert names, "a schema without properties walks nothing"
    assert not names & FORBIDDEN, f"verdict fields in {path}: {names & FORBIDDEN}"


def test_verdict_walk_can_fail() -> None:
    assert set(_property_names({"oneOf": [{"properties": {"grade": {}}}]})) == {"grade"}


def test_asyncapi_documents_every_topic_with_its_delivery() -> None:
    doc = yaml.safe_load(generate()["asyncapi.yaml"])
    assert doc["asyncapi"] == "3.0.0"
    addresses = {ch["address"] for ch in doc["channels"].values()}
    for kind in TopicKind:
        name = build_topic(kind, **_example_ids(kind))
        templated = name.replace("aa_bb_cc_dd_ee_ff", "{dev}").replace("gw-1", "{gw}")
        assert templated in addresses, kind
    assert {"device-server/{dev}", "devices/p2p/{dev}"} <= addresses
    for op in doc["operations"].values():
        channel = doc["channels"][op["channel"]["$ref"].rsplit("/", 1)[1]]
        params = set(re.findall(r"{(\w+)}", channel["address"]))
        assert params == set(channel.get("parameters", {}))
        assert op["action"] in {"send", "receive"}
        assert op["bindings"]["mqtt"]["qos"] in {0, 1}
    retained = {
        doc["channels"][op["channel"]["$ref"].rsplit("/", 1)[1]]["address"]
        for op in doc["operations"].values()
        if op["bindings"]["mqtt"]["retain"]
    }
    assert retained == {
        "snlp/v1/{dev}/status",
        "snlpgw/v1/ops/{gw}/metrics",
        "snlpgw/v1/gw/{gw}/status",
    }
    for message in doc["components"]["messages"].values():
        ref = message["payload"]["$ref"]
        assert (HERE / ref).is_file(), ref


def _example_ids(kind: TopicKind) -> dict[str, str]:
    if kind in {TopicKind.OPS_METRICS, TopicKind.OPS_EVENTS, TopicKind.GW_STATUS}:
        return {"gw": "gw-1"}
    return {"dev": "aa_bb_cc_dd_ee_ff"}


def test_channels_are_unique() -> None:
    assert len({c.id for c in CHANNELS}) == len({c.address for c in CHANNELS}) == len(CHANNELS)


@pytest.mark.parametrize("online", [True, False])
def test_gateway_presence_payload_is_compatible(online: bool) -> None:
    body = presence_payload("gw-1")(online)
    status = parse_snlpgw(TopicKind.GW_STATUS, body)
    assert isinstance(status, GatewayStatus)
    assert status.online is online
    assert status.gateway_id == "gw-1"


def test_metrics_snapshot_becomes_an_ops_message() -> None:
    metrics = Metrics()
    metrics.counter("udp_dropped", "dropped datagrams", ["reason"]).labels("replay").inc(2)
    metrics.gauge("weird", "a gauge set to infinity").set(float("inf"))
    lateness = metrics.quantiles("timer_lateness_ms", "timer lateness")
    lateness.observe(1.5)
    message = OpsMetrics.from_snapshot(metrics.snapshot(), gateway_id="gw-1", ts=1, interval_s=10)
    assert message.metrics['snlpgw_udp_dropped_total{reason="replay"}'] == 2.0
    assert message.metrics['snlpgw_timer_lateness_ms{stat="p50"}'] == 1.5
    assert "snlpgw_weird" not in message.metrics  # JSON has no Infinity
    assert list(message.metrics) == sorted(message.metrics)
    wire = message.model_dump_json().encode()
    assert parse_snlpgw(TopicKind.OPS_METRICS, wire) == message


@pytest.mark.parametrize(
    ("speed", "kept"), [(0.1, 0.5), (0.5, 0.5), (1.25, 1.25), (2, 2.0), (7.5, 2.0)]
)
def test_play_media_speed_is_clamped_not_refused(speed: float, kept: float) -> None:
    assert PlayMedia(name="a.mp3", speed=speed).speed == kept


def test_play_media_speed_must_still_be_a_number() -> None:
    with pytest.raises(ValidationError):
        PlayMedia.model_validate({"name": "a.mp3", "speed": "fast"})
    with pytest.raises(ValidationError):
        PlayMedia.model_validate({"name": "a.mp3", "speed": True})
