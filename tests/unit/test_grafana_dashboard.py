"""deploy/grafana: every PromQL expression of the dashboard names metrics and labels the
gateway exports (read from the registry of a gateway built with the production composition),
the dashboard covers what operators asked for, and the scrape config points at the admin port.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from gateway.app import build_gateway
from gateway.settings import load_settings

DEPLOY = Path(__file__).parents[2] / "deploy" / "grafana"
METRIC = re.compile(r"\bsnlpgw_[a-z0-9_]+\b")
SELECTOR = re.compile(r"(snlpgw_[a-z0-9_]+)\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
TARGET_LABELS = {"instance", "job"}  # added by Prometheus at scrape time


def exported(tmp_path: Path) -> dict[str, set[str]]:
    """Exposition names (with _total/_bucket/... suffixes) → label names, from the registry."""
    # With a manager URL, so the optional manager reporter registers its metrics too.
    settings = load_settings(data_dir=tmp_path, store={"manager_url": "http://127.0.0.1:9"})
    gateway = build_gateway(settings)
    registry = gateway.service.metrics.registry
    out: dict[str, set[str]] = {}
    # prometheus_client has no public map from collector to names; the registry keeps one.
    for collector, names in registry._collector_to_names.items():
        labelnames = getattr(collector, "_labelnames", None)  # None: our Quantiles (stat=)
        labels = set(("stat",) if labelnames is None else labelnames)
        for name in names:
            out[name] = labels | ({"le"} if name.endswith("_bucket") else set())
    return out


def expressions() -> list[str]:
    dashboard = json.loads((DEPLOY / "snlpgw.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["definition"])
    return exprs


def problems(expr: str, names: dict[str, set[str]]) -> list[str]:
    found = []
    used = METRIC.findall(expr)
    if not used:
        found.append("names no snlpgw metric")
    found += [f"unknown metric {m}" for m in used if m not in names]
    for metric, matchers in SELECTOR.findall(expr):
        for label in MATCHER.findall(matchers):
            if label not in names.get(metric, set()) | TARGET_LABELS:
                found.append(f"{metric} has no label {label}")
    available = set().union(*(names.get(m, set()) for m in used)) | TARGET_LABELS
    for group in GROUPING.findall(expr):
        for label in filter(None, (g.strip() for g in group.split(","))):
            if label not in available:
                found.append(f"grouping by {label}, which none of {used} has")
    return found


@pytest.fixture(scope="module")
def names(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    return exported(tmp_path_factory.mktemp("gw"))


def test_every_expression_uses_exported_metrics_and_labels(names: dict[str, set[str]]) -> None:
    exprs = expressions()
    assert len(exprs) > 20
    report = {expr: found for expr in exprs if (found := problems(expr, names))}
    assert report == {}


def test_the_checker_catches_wrong_names_and_labels(names: dict[str, set[str]]) -> None:
    assert problems("rate(snlpgw_no_such_metric_total[5m])", names) == [
        "unknown metric snlpgw_no_such_metric_total"
    ]
    assert problems('snlpgw_xiaozhi_sessions{reason="x"}', names) == [
        "snlpgw_xiaozhi_sessions has no label reason"
    ]
    assert problems("sum by (device) (snlpgw_ops_alarms_total)", names) != []
    assert problems("vector(1)", names) == ["names no snlpgw metric"]


def test_the_dashboard_shows_what_operators_asked_for() -> None:
    text = " ".join(expressions())
    for needed in (
        "snlpgw_xiaozhi_sessions",  # sessions
        "snlpgw_board_devices_online",
        "snlpgw_xiaozhi_opus_frames_decoded_total",  # frames/s
        "sum by (reason) (rate(snlpgw_xiaozhi_udp_dropped_total",  # drops by reason
        "snlpgw_window_lateness_ms",
        "snlpgw_next_clip_gap_ms",
        "snlpgw_asr_queue_depth",
        "snlpgw_asr_latency_ms",
        "snlpgw_ops_alarms_total",
        "snlpgw_mqtt_messages_out_refused_total",  # CONTROL lane full: newest refused
        "snlpgw_mqtt_messages_out_dropped_total",  # EVENTS lane full: oldest dropped
    ):
        assert needed in text, needed


def test_panels_have_unique_ids_and_the_datasource_variable() -> None:
    dashboard = json.loads((DEPLOY / "snlpgw.json").read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"
            assert 'instance=~"$instance"' in target["expr"]


def test_prometheus_scrapes_the_admin_listener() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    http = load_settings().http
    assert job["static_configs"][0]["targets"] == [f"{http.admin_host}:{http.admin_port}"]
    assert job["metrics_path"] == "/metrics"
    assert job["authorization"]["type"] == "Bearer"
