"""Control handler + channel shell with a fake publisher: hello, goodbye, stale sessions, MCP."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gateway.http import HttpServer
from gateway.metrics import Metrics
from gateway.settings import Settings
from gateway.xiaozhi.channel import XiaozhiChannel
from gateway.xiaozhi.mcp import McpError, McpTimeout
from tests.unit.xiaozhi.fakes import (
    DEV,
    HELLO,
    OTHER,
    FakeClock,
    XiaozhiPublisher,
    inbound,
    make_channel,
    sample,
)


class RecordingEvents:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.channels: list[object] = []

    def session_opened(self, dev: str, session_id: str, channel: object) -> None:
        self.calls.append(("opened", dev, session_id))
        self.channels.append(channel)

    def session_closed(self, dev: str, session_id: str, reason: str) -> None:
        self.calls.append(("closed", dev, session_id, reason))

    def listen(
        self, dev: str, session_id: str, state: str, mode: str | None, text: str | None
    ) -> None:
        self.calls.append(("listen", dev, state, mode, text))

    def abort(self, dev: str, session_id: str, reason: str | None) -> None:
        self.calls.append(("abort", dev, reason))

    def mcp_message(self, dev: str, payload: Mapping[str, Any]) -> None:
        self.calls.append(("mcp", dev, dict(payload)))


def test_the_channel_is_wired_once_in_its_constructor() -> None:
    events = RecordingEvents()
    channel, pub, _ = make_channel(events=events)
    ((topic_filter, handler, qos),) = pub.routes  # the control route, registered at once
    assert (topic_filter, qos) == ("device-server/+", 0)
    handler(inbound(DEV, HELLO))
    assert pub.last(DEV)["type"] == "hello"
    assert events.channels == [channel]  # the session's listener gets the channel to answer on


def test_with_http_listeners_the_channel_serves_ota_approvals_and_health(tmp_path: Path) -> None:
    metrics = Metrics()
    http = HttpServer(host="127.0.0.1", port=0, metrics=metrics)
    admin = HttpServer(host="127.0.0.1", port=0, metrics=metrics)
    channel = XiaozhiChannel(
        settings=Settings(data_dir=tmp_path),
        mqtt=XiaozhiPublisher(),
        metrics=metrics,
        http=http,
        admin=admin,
        provision=lambda dev, password: None,
    )
    assert channel.ota is not None
    assert http.health_checks["xiaozhi"]() == {"ok": False, "sessions": 0}  # UDP not bound yet
    channel.ota.close()


def test_hello_reply_is_what_firmware_accepts() -> None:
    channel, pub, metrics = make_channel()
    channel.control.handle(inbound(DEV, HELLO))
    reply = pub.last(DEV)
    assert reply["type"] == "hello"
    assert reply["transport"] == "udp"
    sid = reply["session_id"]
    assert isinstance(sid, str)
    assert len(sid) == 32
    udp = reply["udp"]
    assert (udp["server"], udp["port"], udp["encryption"]) == ("gw.example", 8884, "aes-128-ctr")
    key, nonce = bytes.fromhex(udp["key"]), bytes.fromhex(udp["nonce"])
    session = channel.core.by_dev(DEV)
    assert session is not None
    assert session.session_id == sid
    assert key == session.key
    assert len(key) == 16
    assert nonce == b"\x01\x00\x00\x00" + session.ssrc.to_bytes(4, "big") + bytes(8)
    assert reply["audio_params"]["sample_rate"] == 16000
    assert sample(metrics, "xiaozhi_hellos_total") == 1
    assert sample(metrics, "xiaozhi_sessions") == 1
    assert pub.sent[-1].qos == 0  # QoS 0 like the ecosystem


def test_second_hello_replaces_session_with_fresh_secrets() -> None:
    events = RecordingEvents()
    channel, pub, metrics = make_channel(events=events)
    channel.control.handle(inbound(DEV, HELLO))
    first = pub.last(DEV)
    channel.control.handle(inbound(DEV, HELLO))
    second = pub.last(DEV)
    assert first["session_id"] != second["session_id"]
    assert first["udp"]["key"] != second["udp"]["key"]
    assert first["udp"]["nonce"] != second["udp"]["nonce"]
    assert len(channel.core) == 1
    assert ("closed", DEV, first["session_id"], "replaced") in events.calls
    assert sample(metrics, "xiaozhi_goodbyes_total", side="device", reason="replaced") == 1


def test_device_goodbye_closes_only_its_session() -> None:
    channel, pub, metrics = make_channel()
    channel.control.handle(inbound(DEV, HELLO))
    sid = pub.last(DEV)["session_id"]
    channel.control.handle(inbound(DEV, {"session_id": "stale", "type": "goodbye"}))
    assert channel.session_id(DEV) == sid
    assert sample(metrics, "xiaozhi_control_dropped_total", reason="stale_goodbye") == 1
    sent_before = len(pub.sent)
    channel.control.handle(inbound(DEV, {"session_id": sid, "type": "goodbye"}))
    assert channel.session_id(DEV) is None
    assert len(pub.sent) == sent_before  # no goodbye echoed back to the device
    assert sample(metrics, "xiaozhi_goodbyes_total", side="device", reason="device_goodbye") == 1


@pytest.mark.parametrize(
    "message",
    [
        {"session_id": "old-session", "type": "listen", "state": "start", "mode": "auto"},
        {"session_id": "old-session", "type": "abort"},
    ],
)
def test_message_for_missing_session_gets_goodbye_with_its_session_id(
    message: dict[str, Any],
) -> None:
    channel, pub, metrics = make_channel()
    channel.control.handle(inbound(DEV, message))
    assert pub.last(DEV) == {"type": "goodbye", "session_id": "old-session"}
    assert sample(metrics, "xiaozhi_control_dropped_total", reason="no_session") == 1


def test_listen_and_abort_reach_the_runtime_and_refresh_idle() -> None:
    clock = FakeClock(0.0)
    events = RecordingEvents()
    channel, pub, _ = make_channel(clock, events=events)
    channel.control.handle(inbound(DEV, HELLO))
    sid = pub.last(DEV)["session_id"]
    clock.now = 100.0
    channel.control.handle(
        inbound(DEV, {"session_id": sid, "type": "listen", "state": "detect", "text": "你好小智"})
    )
    channel.control.handle(
        inbound(DEV, {"session_id": sid, "type": "abort", "reason": "wake_word_detected"})
    )
    assert ("listen", DEV, "detect", None, "你好小智") in events.calls
    assert ("abort", DEV, "wake_word_detected") in events.calls
    assert channel.core.next_deadline() == 250.0


def test_gateway_goodbye_carries_exact_session_id() -> None:
    channel, pub, metrics = make_channel()
    channel.control.handle(inbound(DEV, HELLO))
    sid = pub.last(DEV)["session_id"]
    assert channel.close_session(DEV) is True
    assert pub.last(DEV) == {"type": "goodbye", "session_id": sid}
    assert channel.close_session(DEV) is False
    assert sample(metrics, "xiaozhi_goodbyes_total", side="gateway", reason="gateway_goodbye") == 1


@pytest.mark.parametrize(
    ("topic", "payload", "reason"),
    [
        ("device-server/not-a-mac", b"{}", "bad_topic"),
        ("device-server/24_0a_c4_00_00_01/extra", b"{}", "bad_topic"),
        ("elsewhere/24_0a_c4_00_00_01", b"{}", "bad_topic"),
        (None, b"\x00\x01garbage", "malformed_json"),
        (None, b'"just a string"', "not_object"),
        (
            None,
            b'{"type":"hello","version":1,"transport":"udp","audio_params":{"format":"opus"}}',
            "unsupported_version",
        ),
        (None, b'{"type":"ping"}', "ignored_ping"),
        (None, b'{"type":"listen"}', "invalid"),
        (None, b'{"type":"mcp","payload":[]}', "invalid"),
        (None, b"x" * 100_000, "oversize"),
    ],
)
def test_malformed_control_is_counted_and_leaves_sessions_alone(
    topic: str | None, payload: bytes, reason: str
) -> None:
    channel, pub, metrics = make_channel()
    channel.control.handle(inbound(OTHER, HELLO))
    other_sid = channel.session_id(OTHER)
    before = len(pub.sent)
    channel.control.handle(inbound(DEV, payload, topic=topic))
    assert sample(metrics, "xiaozhi_control_dropped_total", reason=reason) == 1
    assert len(pub.sent) == before
    assert channel.session_id(OTHER) == other_sid


def test_runtime_handler_failures_are_contained() -> None:
    class Exploding(RecordingEvents):
        def session_opened(self, dev: str, session_id: str, channel: object) -> None:
            raise RuntimeError("runtime bug")

    channel, pub, _ = make_channel(events=Exploding())
    channel.control.handle(inbound(DEV, HELLO))
    assert pub.last(DEV)["type"] == "hello"


async def test_mcp_request_round_trip_and_isolation() -> None:
    events = RecordingEvents()
    channel, pub, metrics = make_channel(events=events)
    channel.control.handle(inbound(DEV, HELLO))
    sid = pub.last(DEV)["session_id"]
    task = asyncio.create_task(channel.mcp_request(DEV, "tools/list", {"cursor": ""}))
    await asyncio.sleep(0)
    request = pub.last(DEV)
    assert request["type"] == "mcp"
    assert request["session_id"] == sid
    rid = request["payload"]["id"]
    assert isinstance(rid, int)
    assert request["payload"]["method"] == "tools/list"
    # Another device answering with the same id is not taken as the answer.
    channel.control.handle(
        inbound(
            OTHER,
            {
                "session_id": "",
                "type": "mcp",
                "payload": {"jsonrpc": "2.0", "id": rid, "result": {"tools": ["evil"]}},
            },
        )
    )
    assert not task.done()
    assert events.calls[-1][0:2] == ("mcp", OTHER)
    reply = {"jsonrpc": "2.0", "id": rid, "result": {"tools": []}}
    channel.control.handle(inbound(DEV, {"session_id": sid, "type": "mcp", "payload": reply}))
    assert await task == {"tools": []}
    assert sample(metrics, "xiaozhi_mcp_requests_total", outcome="ok") == 1


async def test_mcp_error_and_timeout() -> None:
    channel, pub, metrics = make_channel()
    task = asyncio.create_task(channel.mcp_request(DEV, "tools/call", {"name": "x"}))
    await asyncio.sleep(0)
    request = pub.last(DEV)
    assert request["session_id"] == ""  # MCP flows with no audio session
    error = {"jsonrpc": "2.0", "id": request["payload"]["id"], "error": {"message": "Unknown tool"}}
    channel.control.handle(inbound(DEV, {"session_id": "", "type": "mcp", "payload": error}))
    with pytest.raises(McpError, match="Unknown tool"):
        await task
    with pytest.raises(McpTimeout):
        await channel.mcp_request(DEV, "tools/list", timeout_s=0.01)
    assert sample(metrics, "xiaozhi_mcp_requests_total", outcome="timeout") == 1
    assert channel.mcp.pending == 0
    assert pub.sent[-1].json()["payload"]["method"] == "tools/list"


def test_udp_timeout_ends_the_named_session_like_goodbye() -> None:
    channel, pub, metrics = make_channel()
    channel.control.handle(inbound(DEV, HELLO))
    sid = pub.last(DEV)["session_id"]
    channel.control.handle(inbound(DEV, {"type": "udp_timeout", "session_id": "other"}))
    assert channel.session_id(DEV) == sid
    channel.control.handle(inbound(DEV, {"type": "udp_timeout", "session_id": sid}))
    assert channel.session_id(DEV) is None
    assert sample(metrics, "xiaozhi_goodbyes_total", side="device", reason="device_goodbye") == 1


def test_hellos_past_the_devices_budget_get_no_reply() -> None:
    clock = FakeClock(0.0)
    channel, _, metrics = make_channel(clock, xiaozhi={"hello_burst": 3, "hellos_per_minute": 6})
    for _ in range(10):
        channel.control.handle(inbound(DEV, HELLO))
    assert sample(metrics, "xiaozhi_hellos_total") == 3
    assert sample(metrics, "xiaozhi_control_dropped_total", reason="hello_rate") == 7
    channel.control.handle(inbound(OTHER, HELLO))  # another device has its own budget
    assert channel.session_id(OTHER) is not None
    clock.now = 10.0  # one hello per 10 s
    channel.control.handle(inbound(DEV, HELLO))
    assert sample(metrics, "xiaozhi_hellos_total") == 5
    assert len(channel.core.hellos) == 2


def test_hellos_past_the_session_cap_get_no_reply_but_open_sessions_can_renew() -> None:
    channel, pub, metrics = make_channel(xiaozhi={"max_sessions": 1})
    channel.control.handle(inbound(DEV, HELLO))
    sid = channel.session_id(DEV)
    channel.control.handle(inbound(OTHER, HELLO))
    assert channel.session_id(OTHER) is None
    assert pub.to(OTHER) == []
    assert sample(metrics, "xiaozhi_control_dropped_total", reason="session_cap") == 1
    channel.control.handle(inbound(DEV, HELLO))  # its own session is replaced, not refused
    assert channel.session_id(DEV) not in (None, sid)
    assert channel.close_session(DEV)
    channel.control.handle(inbound(OTHER, HELLO))
    assert channel.session_id(OTHER) is not None


def test_hello_before_the_udp_port_is_bound_gets_no_reply() -> None:
    channel, pub, metrics = make_channel(ready=False)
    channel.control.handle(inbound(DEV, HELLO))
    assert pub.sent == []
    assert channel.session_id(DEV) is None
    assert sample(metrics, "xiaozhi_control_dropped_total", reason="not_ready") == 1


def test_mcp_notification_has_no_id() -> None:
    channel, pub, _ = make_channel()
    channel.mcp_notify(DEV, "notifications/initialized")
    assert pub.last(DEV) == {
        "type": "mcp",
        "payload": {"jsonrpc": "2.0", "method": "notifications/initialized"},
        "session_id": "",
    }


async def test_hello_features_and_tool_lists_reach_the_device_status() -> None:
    """Both askers' answers count: the gateway's own (consumed by its MCP client) and one for
    a bridged server (handed to the events); cuts are counted; a refused hello changes nothing."""
    events = RecordingEvents()
    channel, pub, metrics = make_channel(events=events)
    channel.control.handle(inbound(OTHER, {**HELLO, "version": 2}))  # refused: no record
    assert channel.control.status.get(OTHER) is None
    channel.control.handle(inbound(DEV, HELLO))
    record = channel.control.status.get(DEV)
    assert record is not None
    assert dict(record.features) == HELLO["features"]
    task = asyncio.create_task(channel.mcp_request(DEV, "tools/list"))
    await asyncio.sleep(0)
    rid = pub.last(DEV)["payload"]["id"]
    tools = [{"name": f"self.t{i}", "inputSchema": {}} for i in range(70)]
    answer = {"jsonrpc": "2.0", "id": rid, "result": {"tools": tools}}
    channel.control.handle(inbound(DEV, {"type": "mcp", "payload": answer}))
    assert len((await task)["tools"]) == 70  # the caller gets the whole answer
    record = channel.control.status.get(DEV)
    assert record is not None
    assert (len(record.tools), record.tools_cut) == (64, 6)
    assert sample(metrics, "xiaozhi_status_cut_total", what="tools") == 6
    server = {"jsonrpc": "2.0", "id": 2, "result": {"tools": tools[:1]}}
    channel.control.handle(inbound(DEV, {"type": "mcp", "payload": server}))
    assert events.calls[-1] == ("mcp", DEV, server)
    record = channel.control.status.get(DEV)
    assert record is not None
    assert [t.name for t in record.tools] == ["self.t0"]
    initialize = {"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": "2024-11-05"}}
    channel.control.handle(inbound(DEV, {"type": "mcp", "payload": initialize}))
    assert channel.control.status.get(DEV) == record  # not a tool list: nothing changes
