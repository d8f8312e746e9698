"""BoardChannel shell with fake publisher/router/alarms and a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from gateway.board.channel import BoardChannel
from gateway.board.model import AudioEventKind, BoardAudio, BoardReport, OutcomeKind
from gateway.board.presence import Liveness
from gateway.metrics import Metrics
from gateway.mqtt.edge import Inbound
from gateway.settings import BoardSettings
from tests.unit.board.fakes import (
    DEV,
    DEV2,
    BoardSink,
    FakeAlarms,
    FakePublisher,
    FakeRouter,
    make_rig,
)
from topics.errors import PayloadError, TopicError
from topics.snlp_commands import Download, PlayMedia, StopMedia


async def test_routes_every_uplink_topic() -> None:
    rig = make_rig()
    assert sorted(rig.router.routes) == [
        f"snlp/v1/+/{k}" for k in ("ack", "evt", "hb", "rpt", "status")
    ]


async def test_command_waits_for_board_then_is_acked() -> None:
    rig = make_rig()
    future = rig.channel.send(DEV, PlayMedia(name="a.mp3"))
    assert rig.commands() == []  # never seen: queued
    rig.hb()
    (cmd,) = rig.commands()
    assert cmd["cmd"] == "PLAY_MEDIA"
    assert cmd["params"]["name"] == "a.mp3"
    assert rig.pub.on(f"{DEV}/cmd")[0].qos == 1
    rig.clock.now += 0.2
    rig.ack(cmd["id"])
    outcome = future.result()
    assert outcome.kind is OutcomeKind.ACCEPTED
    assert outcome.delivered
    assert outcome.ack_latency_s == pytest.approx(0.2)
    assert rig.metric('board_commands_sent_total{cmd="PLAY_MEDIA"}') == 1
    assert rig.metric('board_commands_acked_total{cmd="PLAY_MEDIA",status="accepted"}') == 1
    assert rig.metric('board_ack_latency_seconds_count{cmd="PLAY_MEDIA"}') == 1


async def test_presence_online_writes_retained_status_and_task_event() -> None:
    rig = make_rig()
    rig.hb()
    (status,) = rig.pub.on(f"{DEV}/status")
    assert status.retain
    assert status.qos == 1
    assert status.json()["online"] is True
    assert status.json()["by"] == "gateway"
    (task,) = rig.pub.on(f"snlpgw/v1/task/{DEV}")
    assert task.json()["event"] == "presence.changed"
    assert task.json()["data"] == {"online": True}
    assert [c.online for c in rig.sink.changes] == [True]
    assert rig.channel.is_online(DEV)
    assert rig.metric("board_devices_online") == 1


async def test_own_retained_status_is_not_evidence() -> None:
    rig = make_rig()
    rig.deliver(DEV, "status", {"v": 1, "online": True, "by": "gateway"})
    assert not rig.channel.is_online(DEV)
    assert rig.sink.changes == []


async def test_missed_heartbeats_then_offline_then_back() -> None:
    rig = make_rig(heartbeat_s=1.0, missed_heartbeats=3)
    rig.hb()
    rig.advance(2.9)
    assert rig.channel.is_online(DEV)
    rig.advance(0.1)
    assert not rig.channel.is_online(DEV)
    statuses = [p.json()["online"] for p in rig.pub.on(f"{DEV}/status")]
    assert statuses == [True, False]
    rig.hb()
    assert rig.channel.is_online(DEV)
    assert [c.reason for c in rig.sink.changes] == ["heartbeat", "missed_heartbeats", "heartbeat"]


async def test_board_lwt_is_honoured_without_a_gateway_write() -> None:
    rig = make_rig()
    rig.deliver(DEV, "status", {"v": 1, "online": True, "session": "s1"})
    rig.deliver(DEV, "status", {"v": 1, "online": False, "session": "s1"})
    assert not rig.channel.is_online(DEV)
    assert rig.pub.on(f"{DEV}/status") == []
    assert [p.json()["data"]["online"] for p in rig.pub.on(f"task/{DEV}")] == [True, False]


async def test_first_news_of_a_board_saying_offline_leaves_the_online_count_alone() -> None:
    rig = make_rig()
    rig.deliver("11_22_33_44_55_66", "status", {"v": 1, "online": False, "session": "s0"})
    assert rig.metric("board_devices_online") == 0
    rig.hb()
    assert rig.metric("board_devices_online") == 1


async def test_resend_same_id_then_duplicate_ack_counts_as_delivered() -> None:
    rig = make_rig()
    rig.hb()
    future = rig.channel.send(DEV, StopMedia())
    rig.advance(3.0)
    first, second = rig.pub.on(f"{DEV}/cmd")
    assert first.payload == second.payload
    rig.ack(first.json()["id"], "duplicate")
    assert future.result().kind is OutcomeKind.DUPLICATE
    assert future.result().sends == 2
    assert rig.metric('board_commands_resent_total{cmd="STOP_MEDIA"}') == 1


async def test_resends_exhausted_fail_with_alarm() -> None:
    rig = make_rig(max_resends=1)
    rig.hb()
    future = rig.channel.send(DEV, StopMedia())
    rig.advance(3.0)
    rig.hb()  # keep the board online
    rig.advance(5.9)
    assert not future.done()  # the resend waits twice as long (board.resend_backoff = 2)
    rig.advance(0.1)
    assert future.result().kind is OutcomeKind.FAILED
    assert rig.alarms.names() == ["ack_timeout"]
    assert rig.metric('board_commands_failed_total{cmd="STOP_MEDIA",reason="no_ack"}') == 1


async def test_offline_command_expires_with_alarm() -> None:
    rig = make_rig()
    future = rig.channel.send(DEV, PlayMedia(name="a.mp3"), ttl_ms=2000)
    rig.advance(1.0)
    assert not future.done()
    rig.advance(1.0)
    assert future.result().kind is OutcomeKind.EXPIRED
    assert rig.alarms.names() == ["command_expired"]
    assert rig.metric('board_commands_expired_total{cmd="PLAY_MEDIA"}') == 1
    rig.hb()
    assert rig.commands() == []


async def test_unmatched_ack_is_counted() -> None:
    rig = make_rig()
    rig.ack("nope")
    assert rig.metric('board_inbound_unmatched_total{kind="ack"}') == 1


@pytest.mark.parametrize(
    ("topic_dev", "kind", "payload", "label"),
    [
        (DEV, "ack", b"{not json", 'kind="ack",reason="malformed_json"'),
        (DEV, "ack", b"[1]", 'kind="ack",reason="not_object"'),
        (DEV, "ack", b'{"v":1,"ref":"x","status":"maybe"}', 'kind="ack",reason="invalid"'),
        (DEV, "rpt", b'{"v":1,"ref":"x","stage":"done"}', 'kind="rpt",reason="invalid"'),
        (DEV, "evt", b'{"v":1,"evt":"sd.mounted","data":{}}', 'kind="evt",reason="unknown_type"'),
        (DEV, "evt", b"[skill_event]exploded|1", 'kind="evt",reason="unknown_type"'),
        (DEV, "hb", b'{"v":2}', 'kind="hb",reason="unsupported_version"'),
        (DEV, "status", b"\xff\xfe", 'kind="status",reason="malformed_json"'),
        ("AA_BB", "evt", b"{}", 'kind="unknown",reason="bad_topic"'),
        (DEV, "cmd", b"{}", 'kind="cmd",reason="not_uplink"'),
    ],
)
async def test_bad_input_is_a_counted_drop(
    topic_dev: str, kind: str, payload: bytes, label: str
) -> None:
    rig = make_rig()
    rig.deliver(topic_dev, kind, payload)
    assert rig.metric(f"board_inbound_dropped_total{{{label}}}") == 1
    assert rig.sink.events == []


async def test_too_many_devices_is_a_counted_drop_and_overflow() -> None:
    rig = make_rig()
    rig.hb(DEV)
    rig.hb(DEV2)
    busy = [rig.channel.send(d, StopMedia()) for d in (DEV, DEV2)]  # both have commands pending
    rig.hb("aa_bb_cc_dd_ee_03")
    assert rig.metric('board_inbound_dropped_total{kind="hb",reason="too_many_devices"}') == 1
    assert not any(f.done() for f in busy)
    future = rig.channel.send("aa_bb_cc_dd_ee_03", StopMedia())
    assert future.result().kind is OutcomeKind.OVERFLOW
    with pytest.raises(TopicError):
        rig.channel.send("not-a-device", StopMedia())


async def test_legacy_and_structured_events_are_the_same_typed_event() -> None:
    rig = make_rig()
    rig.deliver(
        DEV,
        "evt",
        {
            "v": 1,
            "evt": "audio.completed",
            "ref": None,
            "data": {"duration_ms": 2140, "reason": "eof"},
        },
    )
    rig.deliver(DEV, "evt", "[skill_event]completed|2140")
    structured, legacy = rig.sink.events
    assert (
        structured.body
        == legacy.body
        == BoardAudio(AudioEventKind.COMPLETED, duration_ms=2140, reason="eof")
    )
    assert (structured.legacy, legacy.legacy) == (False, True)
    assert legacy.received_ms == 1_764_460_800_000
    assert rig.channel.is_online(DEV)  # an event is a sign of life
    assert rig.metric('board_events_total{evt="audio.completed",form="legacy"}') == 1


async def test_button_and_app_task_events() -> None:
    rig = make_rig()
    rig.deliver(DEV, "evt", {"evt": "button", "data": {"press": "double", "key": "play"}})
    rig.deliver(
        DEV,
        "evt",
        {"evt": "app_task.state", "ref": "c9", "data": {"state": "running", "detail": {"n": 1}}},
    )
    button, task = (e.body for e in rig.sink.events)
    assert button.press.value == "double"  # type: ignore[union-attr]
    assert task.state == "running"  # type: ignore[union-attr]
    assert dict(task.detail) == {"n": 1}  # type: ignore[union-attr]
    assert rig.sink.events[1].ref == "c9"


async def test_ensure_app_dirs_once_per_session() -> None:
    rig = make_rig(heartbeat_s=1.0)
    rig.hb()
    first = asyncio.ensure_future(rig.channel.ensure_app_dirs(DEV, "shadowing"))
    second = asyncio.ensure_future(rig.channel.ensure_app_dirs(DEV, "shadowing"))
    await asyncio.sleep(0)
    (cmd,) = rig.commands()
    assert cmd["cmd"] == "ENSURE_APP_DIRS"
    rig.ack(cmd["id"])
    assert (await first).delivered
    assert (await second).id == cmd["id"]
    assert (await rig.channel.ensure_app_dirs(DEV, "shadowing")).id == cmd["id"]
    assert len(rig.commands()) == 1
    rig.advance(3.0)  # missed heartbeats: offline
    rig.hb()  # back: a new session
    again = asyncio.ensure_future(rig.channel.ensure_app_dirs(DEV, "shadowing"))
    await asyncio.sleep(0)
    assert len(rig.commands()) == 2
    rig.ack(rig.commands()[-1]["id"], "rejected")
    assert (await again).kind is OutcomeKind.REJECTED
    retry = asyncio.ensure_future(rig.channel.ensure_app_dirs(DEV, "shadowing"))
    await asyncio.sleep(0)
    assert len(rig.commands()) == 3  # a failure is not remembered
    rig.hb(up_ms=5)
    rig.ack(rig.commands()[-1]["id"])
    await retry
    rig.hb(up_ms=1)  # uptime went backwards: the board rebooted
    after_reboot = asyncio.ensure_future(rig.channel.ensure_app_dirs(DEV, "shadowing"))
    await asyncio.sleep(0)
    assert len(rig.commands()) == 4
    rig.ack(rig.commands()[-1]["id"])
    assert (await after_reboot).delivered


SHA = "0" * 64


async def test_download_progress_and_final_report() -> None:
    rig = make_rig()
    rig.hb()
    progress: list[BoardReport] = []
    params = Download(url="http://h/a.mp3", path="/x/a.mp3", size=10, sha256=SHA)
    download = rig.channel.download(DEV, params, on_progress=progress.append)
    (cmd,) = rig.commands()
    assert download.id == cmd["id"]
    rig.ack(cmd["id"])
    assert (await download.acked).delivered
    rig.deliver(
        DEV,
        "rpt",
        {"ref": cmd["id"], "cmd": "DOWNLOAD", "stage": "progress", "bytes": 5, "total": 10},
    )
    rig.deliver(
        DEV,
        "rpt",
        {
            "ref": cmd["id"],
            "cmd": "DOWNLOAD",
            "stage": "done",
            "ok": True,
            "bytes": 10,
            "sha256": SHA,
        },
    )
    assert [p.bytes for p in progress] == [5]
    final = await download.result
    assert (final.ok, final.bytes, final.sha256) == (True, 10, SHA)
    rig.deliver(DEV, "rpt", {"ref": cmd["id"], "cmd": "DOWNLOAD", "stage": "done", "ok": True})
    assert rig.metric('board_inbound_unmatched_total{kind="rpt"}') == 1


async def test_download_fails_when_not_delivered_or_board_drops() -> None:
    rig = make_rig(heartbeat_s=1.0)
    params = Download(url="http://h/a.mp3", path="/x/a.mp3", size=10, sha256=SHA)
    never = rig.channel.download(DEV, params, ttl_ms=500)
    rig.advance(0.5)
    final = await never.result
    assert (final.ok, final.code) == (False, "not_delivered:expired")
    rig.hb()
    dropped = rig.channel.download(DEV, params)
    rig.ack(rig.commands()[-1]["id"])
    rig.deliver(DEV, "status", {"online": False})
    final = await dropped.result
    assert (final.ok, final.code) == (False, "board_offline")
    rig.hb()
    rig.hb(DEV2)  # fills the device table (max_devices=2) with boards online, and busy:
    rig.channel.send(DEV, StopMedia())
    rig.channel.send(DEV2, StopMedia())
    refused = rig.channel.download("aa_bb_cc_dd_ee_09", params)
    final = await refused.result
    assert (final.ok, final.code) == (False, "not_delivered:overflow")


async def test_flapping_raises_alarm() -> None:
    rig = make_rig(flap_threshold=3, flap_window_s=60.0)
    for online in (True, False, True):
        rig.deliver(DEV, "status", {"online": online})
    assert rig.alarms.names() == ["device_flapping"]


async def test_timer_task_resends_and_cancels_on_shutdown() -> None:
    s = BoardSettings(ack_timeout_s=0.01, max_resends=50)
    pub = FakePublisher()
    channel = BoardChannel(
        settings=s,
        router=FakeRouter(),
        publisher=pub,
        metrics=Metrics(),
        alarms=FakeAlarms(),
        sink=BoardSink(),
    )
    async with asyncio.TaskGroup() as tg:
        timer = tg.create_task(channel.run(), name="board.timer")
        channel.handle(Inbound(f"snlp/v1/{DEV}/hb", b"{}", 0, False, 0.0, 0))
        future = channel.send(DEV, StopMedia())
        async with asyncio.timeout(5):
            while len(pub.on(f"{DEV}/cmd")) < 3:
                pub.event.clear()
                await pub.event.wait()
        timer.cancel()
    assert future.result().kind is OutcomeKind.CANCELLED
    assert len({p.payload for p in pub.on(f"{DEV}/cmd")}) == 1


async def test_presence_state_enum_exposed() -> None:
    assert Liveness.UNKNOWN.value == "unknown"


async def test_submit_from_runtime_effect_uses_its_command_id() -> None:
    rig = make_rig()
    rig.hb()
    future = rig.channel.submit(
        DEV, "PLAY_MEDIA", {"name": "u/01.mp3", "repeat": 3}, command_id="rt-1", prio=3
    )
    (cmd,) = rig.commands()
    assert (cmd["id"], cmd["prio"], cmd["params"]["repeat"]) == ("rt-1", 3, 3)
    with pytest.raises(ValueError, match="already pending"):
        rig.channel.submit(DEV, "STOP_MEDIA", {}, command_id="rt-1")
    with pytest.raises(PayloadError):
        rig.channel.submit(DEV, "PLAY_MEDIA", {"name": ""})
    with pytest.raises(PayloadError):
        rig.channel.submit(DEV, "SELF_DESTRUCT", {})
    rig.ack("rt-1")
    assert future.result().id == "rt-1"


async def test_events_are_counted_and_cancelled_callers_still_resolve() -> None:
    rig = make_rig()
    rig.hb()
    rig.deliver(DEV, "evt", "[skill_event]completed|5")
    assert rig.metric('board_events_total{evt="audio.completed",form="legacy"}') == 1
    assert len(rig.sink.events) == 1
    future = rig.channel.send(DEV, StopMedia())
    future.cancel()  # the caller gave up; the ack still resolves the command
    rig.ack(rig.commands()[-1]["id"])
    assert rig.metric('board_commands_acked_total{cmd="STOP_MEDIA",status="accepted"}') == 1


async def test_ensure_app_dirs_when_the_device_table_is_full() -> None:
    rig = make_rig()
    rig.hb(DEV)
    rig.hb(DEV2)
    rig.channel.send(DEV, StopMedia())
    rig.channel.send(DEV2, StopMedia())
    outcome = await rig.channel.ensure_app_dirs("aa_bb_cc_dd_ee_03", "shadowing")
    assert outcome.kind is OutcomeKind.OVERFLOW


async def test_download_without_progress_callback_and_cancelled_result() -> None:
    rig = make_rig()
    rig.hb()
    params = Download(url="http://h/a.mp3", path="/x/a.mp3", size=10, sha256=SHA)
    quiet = rig.channel.download(DEV, params)
    ref = rig.commands()[-1]["id"]
    rig.ack(ref)
    rig.deliver(DEV, "rpt", {"ref": ref, "cmd": "DOWNLOAD", "stage": "progress", "bytes": 5})
    quiet.result.cancel()
    rig.deliver(DEV, "rpt", {"ref": ref, "cmd": "DOWNLOAD", "stage": "done", "ok": True})
    assert rig.metric('board_reports_total{cmd="DOWNLOAD",stage="done"}') == 1
    dropped = rig.channel.download(DEV, params)
    rig.ack(rig.commands()[-1]["id"])
    dropped.result.cancel()
    rig.deliver(DEV, "status", {"online": False})  # fails pending downloads; cancelled is skipped
    assert not rig.channel.is_online(DEV)


async def test_new_board_session_in_status_forgets_app_dirs() -> None:
    rig = make_rig()
    rig.deliver(DEV, "status", {"online": True, "session": "boot-1"})
    first = asyncio.ensure_future(rig.channel.ensure_app_dirs(DEV, "shadowing"))
    await asyncio.sleep(0)
    rig.ack(rig.commands()[-1]["id"])
    await first
    rig.deliver(DEV, "status", {"online": True, "session": "boot-1"})  # same session: remembered
    await rig.channel.ensure_app_dirs(DEV, "shadowing")
    assert len(rig.commands()) == 1
    rig.deliver(DEV, "status", {"online": True, "session": "boot-2"})  # rebooted
    again = asyncio.ensure_future(rig.channel.ensure_app_dirs(DEV, "shadowing"))
    await asyncio.sleep(0)
    assert len(rig.commands()) == 2
    rig.ack(rig.commands()[-1]["id"])
    assert (await again).delivered


async def test_idle_then_quiet_boards_are_evicted_to_make_room() -> None:
    rig = make_rig()  # max_devices=2
    rig.hb(DEV)
    queued = rig.channel.send(DEV2, StopMedia())  # DEV2 never seen online, but has a command
    rig.deliver(DEV, "status", {"online": False})  # DEV: offline, nothing pending
    rig.hb("aa_bb_cc_dd_ee_03")
    assert rig.channel.is_online("aa_bb_cc_dd_ee_03")
    assert rig.metric("board_devices_evicted_total") == 1
    assert not queued.done()  # DEV2 was not idle: kept
    rig.hb("aa_bb_cc_dd_ee_04")  # nobody idle: 03 is online but quiet, so it goes
    assert rig.metric("board_devices_evicted_total") == 2
    assert rig.channel.is_online("aa_bb_cc_dd_ee_04")
    assert not rig.channel.is_online("aa_bb_cc_dd_ee_03")
    assert not queued.done()  # DEV2 has a command pending: never forgotten
    rig.channel.send("aa_bb_cc_dd_ee_04", StopMedia())
    rig.hb("aa_bb_cc_dd_ee_05")  # everyone has commands pending now
    assert rig.metric('board_inbound_dropped_total{kind="hb",reason="too_many_devices"}') == 1


async def test_drop_logging_is_throttled(caplog: pytest.LogCaptureFixture) -> None:
    rig = make_rig()
    for _ in range(150):
        rig.deliver(DEV, "ack", b"{nope")
    assert rig.metric('board_inbound_dropped_total{kind="ack",reason="malformed_json"}') == 150
    assert len([r for r in caplog.records if "dropped board message" in r.message]) == 2


async def test_late_ack_from_returning_board_is_not_resent_first() -> None:
    rig = make_rig(heartbeat_s=1.0)
    rig.hb()
    future = rig.channel.send(DEV, StopMedia())
    rig.advance(3.0)  # silent: offline; the command goes back to the queue
    assert not rig.channel.is_online(DEV)
    rig.ack(rig.commands()[-1]["id"])  # the ack arrives with the board's return
    assert future.result().kind is OutcomeKind.ACCEPTED
    assert len(rig.commands()) == 1  # offline at 3 s (no resend), and none on return


async def test_listen_stop_and_next_play_leave_together_and_resolve_by_their_own_acks() -> None:
    rig = make_rig(max_in_flight=4)
    rig.hb()
    stop = rig.channel.submit(DEV, "LISTEN_STOP", {}, command_id="stop-1")
    play = rig.channel.submit(DEV, "PLAY_MEDIA", {"name": "b.mp3"}, command_id="play-2")
    # Both on the wire before any ack, in submit order, on the one cmd topic at QoS 1.
    assert [c["id"] for c in rig.commands()] == ["stop-1", "play-2"]
    assert {p.qos for p in rig.pub.on(f"{DEV}/cmd")} == {1}
    rig.ack("play-2")  # acks may come in any order
    assert play.result().kind is OutcomeKind.ACCEPTED
    assert not stop.done()
    rig.advance(3.0)  # stop's own deadline: resent alone, same bytes
    first, *_, resent = rig.pub.on(f"{DEV}/cmd")
    assert resent.payload == first.payload
    rig.ack("stop-1", "duplicate")
    assert stop.result().kind is OutcomeKind.DUPLICATE
    assert [c["id"] for c in rig.commands()] == ["stop-1", "play-2", "stop-1"]


async def test_window_of_one_keeps_commands_one_at_a_time() -> None:
    rig = make_rig(max_in_flight=1)
    rig.hb()
    rig.channel.submit(DEV, "LISTEN_STOP", {}, command_id="stop-1")
    rig.channel.submit(DEV, "PLAY_MEDIA", {"name": "b.mp3"}, command_id="play-2")
    assert [c["id"] for c in rig.commands()] == ["stop-1"]
    rig.ack("stop-1")
    assert [c["id"] for c in rig.commands()] == ["stop-1", "play-2"]


async def test_ack_deadline_counts_from_when_the_command_left_not_when_it_was_queued() -> None:
    rig = make_rig(max_resends=1)
    rig.hb()
    rig.pub.hold = True  # the MQTT outbox is backed up: the command has not left the gateway
    future = rig.channel.send(DEV, StopMedia())
    rig.advance(10.0)
    assert len(rig.pub.on("/cmd")) == 1  # queued once, and no resend behind it
    assert rig.metric('board_commands_resent_total{cmd="STOP_MEDIA"}') == 0
    rig.pub.release()  # it leaves now: its deadline starts
    rig.hb()
    rig.advance(2.9)
    assert len(rig.pub.on("/cmd")) == 1
    rig.advance(0.1)
    assert len(rig.pub.on("/cmd")) == 2  # resent 3 s after it left
    assert not future.done()
