from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway import settings_doc
from gateway.settings import load_settings

SETTINGS_DOC = Path(__file__).parents[2] / settings_doc.DOC


def test_defaults_match_spec_section_8() -> None:
    s = load_settings()
    assert (s.mqtt.host, s.mqtt.port) == ("127.0.0.1", 1883)
    assert (s.http.host, s.http.port) == ("127.0.0.1", 8003)
    assert s.udp.port == 8884
    assert s.data_dir == Path(".data")
    assert s.sqlite_path == Path(".data/gateway.sqlite3")
    assert s.ops.metrics_interval_s == 10


def test_environment_overrides_toml_which_overrides_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text(
        'gateway_id = "from-file"\n[mqtt]\nurl = "mqtts://broker.example:8883"\n[udp]\nport = 9000\n'
    )
    monkeypatch.setenv("SNLPGW_UDP__PORT", "9100")
    s = load_settings(cfg)
    assert s.gateway_id == "from-file"
    assert s.mqtt.tls
    assert s.mqtt.port == 8883
    assert s.udp.port == 9100


def test_collector_thresholds_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().ops.gc_thresholds == (700, 100, 10)
    monkeypatch.setenv("SNLPGW_OPS__GC_THRESHOLDS", "[1000, 50, 20]")
    assert load_settings().ops.gc_thresholds == (1000, 50, 20)
    monkeypatch.setenv("SNLPGW_OPS__GC_THRESHOLDS", "null")
    assert load_settings().ops.gc_thresholds is None


def test_settings_are_frozen() -> None:
    s = load_settings()
    with pytest.raises(ValidationError):
        s.gateway_id = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ("SNLPGW_MQTT__URL", "http://nope"),
        ("SNLPGW_GATEWAY_ID", "has space"),
        ("SNLPGW_HTTP__PORT", "70000"),
        ("SNLPGW_MQTT__NOPE", "1"),
        ("SNLPGW_OPS__GC_THRESHOLDS", "[700, 0, 10]"),
        ("SNLPGW_OPS__GC_THRESHOLDS", "[700, 100]"),
    ],
)
def test_bad_values_are_clear_errors(monkeypatch: pytest.MonkeyPatch, env: str, value: str) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ValidationError):
        load_settings()


def test_missing_config_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config file not found"):
        load_settings(tmp_path / "absent.toml")


def test_settings_page_table_is_current() -> None:
    text = SETTINGS_DOC.read_text(encoding="utf-8")
    start = text.index(settings_doc.BEGIN)
    end = text.index(settings_doc.END) + len(settings_doc.END)
    assert text[start:end] == settings_doc.render(), "run: python -m gateway.settings_doc --write"


@pytest.mark.parametrize(
    ("url", "host", "port", "tls"),
    [
        ("mqtt://127.0.0.1:1883", "127.0.0.1", 1883, False),
        ("mqtt://broker.lan", "broker.lan", 1883, False),
        ("mqtts://Broker.Example", "broker.example", 8883, True),
        ("mqtts://broker.example:9883", "broker.example", 9883, True),
        ("mqtt://[::1]:1884", "::1", 1884, False),  # a socket takes the literal bare
    ],
)
def test_mqtt_url_forms(url: str, host: str, port: int, tls: bool) -> None:
    mqtt = load_settings(mqtt={"url": url}).mqtt
    assert (mqtt.host, mqtt.port, mqtt.tls) == (host, port, tls)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://broker.lan", "URL scheme should be 'mqtt' or 'mqtts'"),
        ("broker.lan:1883", "URL scheme should be 'mqtt' or 'mqtts'"),
        ("mqtt://", "empty host"),
        ("mqtt://broker.lan:99999", "invalid port number"),
    ],
)
def test_mqtt_url_refusals_say_why(url: str, says: str) -> None:
    with pytest.raises(ValidationError, match=r"mqtt\.url") as refused:
        load_settings(mqtt={"url": url})
    assert says in str(refused.value)


def test_tls_files_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only paths are checked here; the files are read when the gateway starts (mqtt/tls.py)."""
    monkeypatch.setenv("SNLPGW_MQTT__URL", "mqtts://broker.example")
    monkeypatch.setenv("SNLPGW_MQTT__CA_FILE", "/etc/snlpgw/ca.crt")
    monkeypatch.setenv("SNLPGW_MQTT__CERT_FILE", "/etc/snlpgw/gw.crt")
    monkeypatch.setenv("SNLPGW_MQTT__KEY_FILE", "/etc/snlpgw/gw.key")
    mqtt = load_settings().mqtt
    assert mqtt.ca_file == Path("/etc/snlpgw/ca.crt")
    assert (mqtt.cert_file, mqtt.key_file) == (
        Path("/etc/snlpgw/gw.crt"),
        Path("/etc/snlpgw/gw.key"),
    )
    assert mqtt.tls


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        (
            {"url": "mqtts://b", "cert_file": "gw.crt"},
            "mqtt.cert_file is set without mqtt.key_file: a client certificate needs both",
        ),
        (
            {"url": "mqtts://b", "ca_file": "ca.crt", "key_file": "gw.key"},
            "mqtt.key_file is set without mqtt.cert_file: a client certificate needs both",
        ),
        (
            {"url": "mqtt://b", "ca_file": "ca.crt"},
            "mqtt.ca_file is for TLS, but mqtt.url is mqtt://: use an mqtts:// URL (or unset it)",
        ),
        (
            {"url": "mqtt://b", "cert_file": "gw.crt", "key_file": "gw.key"},
            "mqtt.cert_file and mqtt.key_file are for TLS, but mqtt.url is mqtt://: use an "
            "mqtts:// URL (or unset them)",
        ),
    ],
)
def test_tls_file_settings_refusals_say_what_to_fix(fields: dict[str, str], says: str) -> None:
    with pytest.raises(ValidationError) as refused:
        load_settings(mqtt=fields)
    assert says in str(refused.value)
