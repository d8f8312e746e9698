"""The MQTT client benchmark (bench/mqtt_client_bench.py) end to end at a tiny size: every
client completes its round trips against a real Mosquitto, and the result files have the
structure bench/results/mqtt_client.md is read for. No figure is judged here (the committed
results are the benchmark's business)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.mqtt_client_bench import GATEWAY, RUNNERS

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def test_a_tiny_run_measures_every_client_and_writes_json_and_markdown(tmp_path: Path) -> None:
    tiny = ["--messages", "100", "--repeats", "2", "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "bench.mqtt_client_bench", *tiny],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((tmp_path / "mqtt_client.json").read_text())
    assert set(doc["results"]) == set(RUNNERS) == {GATEWAY, "paho-mqtt", "aiomqtt", "gmqtt"}
    for result in doc["results"].values():
        cpu = result["cpu_us_per_round_trip"]
        assert 0 < cpu["min"] <= cpu["median"] <= cpu["max"]
        assert len(result["runs_cpu_us"]) == 2
    assert doc["results"][GATEWAY]["ratio_to_gateway"] == 1.0
    assert doc["verdict"]["best_other"] in set(RUNNERS) - {GATEWAY}
    assert set(doc["machine"]["libraries"]) == {"paho-mqtt", "aiomqtt", "gmqtt"}
    table = (tmp_path / "mqtt_client.md").read_text()
    for name in RUNNERS:
        assert f"| {name} |" in table
