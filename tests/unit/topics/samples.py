"""One or more sample of every message type, with the parse function and schema that cover it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from pydantic import BaseModel

from topics import TopicKind, parse_board_message, parse_command, parse_snlpgw, parse_xiaozhi
from topics import backend as b
from topics import ops as o
from topics import snlp as s
from topics import snlp_commands as c
from topics import snlp_events as e
from topics import xiaozhi as x
from topics.xiaozhi import parse_xiaozhi_downlink

DEV = "aa_bb_cc_dd_ee_ff"
TS = 1_764_460_800_123
SHA = "ab" * 32
KEY = "0123456789abcdef0123456789abcdef"
NONCE = "01000000deadbeef0000000000000000"


@dataclass(frozen=True)
class Sample:
    id: str
    schema: str
    parse: Callable[[bytes], object]
    model: BaseModel


def _cmd(params: c.CommandParams, verb: c.TaskVerb | None = None) -> c.Command:
    return c.command(params, id="c1", ts=TS, prio=3, ttl_ms=15_000, task_verb=verb)


def _board(kind: TopicKind) -> Callable[[bytes], object]:
    return partial(parse_board_message, kind)


def _gw(kind: TopicKind) -> Callable[[bytes], object]:
    return partial(parse_snlpgw, kind)


_COMMANDS: list[tuple[str, c.Command]] = [
    ("play_media", _cmd(c.PlayMedia(name="/english_learning/shadowing/lessons/unit01/01.mp3"))),
    ("play_media_full", _cmd(c.PlayMedia(name="a.mp3", speed=0.75, repeat=3, volume=60, power_off_after=True))),
    ("stop_media", _cmd(c.StopMedia(target_ref="c0"))),
    ("stop_media_any", _cmd(c.StopMedia())),
    ("audio_pause", _cmd(c.AudioPause())),
    ("audio_resume", _cmd(c.AudioResume())),
    ("download", _cmd(c.Download(url="https://cdn.example/a.mp3?sig=1", path="/a/b.mp3", size=123456, sha256=SHA))),
    ("ensure_app_dirs", _cmd(c.EnsureAppDirs(app="english_learning", dirs=["audio", "cfg"]))),
    ("start_app_task", _cmd(c.StartAppTask(app="english_learning", task="shadowing", args={"lesson": "unit01", "n": [1, 2.5, None]}))),
    *[
        (verb.lower(), _cmd(c.TaskControl(app="english_learning", task="shadowing"), verb))
        for verb in ("TASK_START", "TASK_PAUSE", "TASK_RESUME", "TASK_STOP", "TASK_RESTART")
    ],
    ("listen_start", _cmd(c.ListenStart(mode="manual", timeout_ms=5000))),
    ("listen_stop", _cmd(c.ListenStop())),
    ("sound", _cmd(c.Sound(type="ding"))),
    ("indicate", _cmd(c.Indicate(state="TASK_RUNNING"))),
    ("wait", _cmd(c.Wait(ms=800))),
]  # fmt: skip

_EVENTS: list[tuple[str, e.Event]] = [
    *[
        (name, e.AudioEvent(id="e1", ts=TS, ref="c1", evt=name, data=e.AudioData(name="01.mp3", duration_ms=2140, reason="eof")))  # type: ignore[arg-type]
        for name in sorted(e.AUDIO_EVENTS)
    ],
    ("audio_failed_code", e.AudioEvent(ref=None, evt="audio.failed", data=e.AudioData(name="x.mp3", reason="error", code="ENOENT", position_ms=10))),
    ("button", e.ButtonEvent(id="e2", ts=TS, evt="button", data=e.ButtonData(press="long", key="boot"))),
    ("app_task", e.AppTaskEvent(id="e3", ts=TS, evt="app_task.state", data=e.AppTaskData(state="running", detail={"step": 2}))),
    ("unknown_event", e.UnknownEvent(id="e4", ts=TS, evt="sd.mounted", data={"free_mb": 512})),
    ("sound_completed", e.CueEvent(id="e5", ts=TS, ref="c7", evt="sound.completed", data=e.CueData(type="ding"))),
    ("wait_elapsed", e.CueEvent(id="e6", ts=TS, ref="c8", evt="wait.elapsed", data=e.CueData(ms=800))),
    ("wait_cancelled", e.CueEvent(ref="c8", evt="wait.cancelled")),
]  # fmt: skip

_UP: list[tuple[str, BaseModel]] = [
    ("hello", x.DeviceHello(type="hello", version=3, transport="udp", features=x.Features(aec=True, mcp=True, glyph_push=False), audio_params=x.AudioParams(), text_font=x.TextFont(bundle="b", charset="c", size=16, bpp=1))),
    ("listen", x.Listen(session_id="s1", type="listen", state="start", mode="auto")),
    ("listen_detect", x.Listen(session_id="", type="listen", state="detect", text="你好小智")),
    ("abort", x.Abort(session_id="s1", type="abort", reason="wake_word_detected")),
    ("mcp", x.DeviceMcp(session_id="", type="mcp", payload=x.JsonRpc(jsonrpc="2.0", id=1, result={"tools": []}))),
    ("goodbye", x.DeviceGoodbye(session_id="s1", type="goodbye")),
    ("udp_timeout", x.UdpTimeout(session_id="s1", type="udp_timeout")),
    ("ping", x.Ping(type="ping")),
    ("iot", x.Iot(session_id="", type="iot", update=True, descriptors=[{"name": "Speaker"}])),
    ("task_report", x.DeviceTaskReport(session_id="s1", type="step.completed", task_instance_id="i1", step_id="i1:0")),
    ("task_report_speech", x.DeviceTaskReport(session_id="s1", type="speech.started", task_instance_id="i1", step_id="i1:0")),
]  # fmt: skip

_DOWN: list[tuple[str, BaseModel]] = [
    ("hello", x.ServerHello(session_id="s1", udp=x.UdpParams(server="127.0.0.1", port=8884, key=KEY, nonce=NONCE))),
    ("goodbye", x.ServerGoodbye(session_id="s1")),
    ("tts", x.Tts(state="sentence_start", text="Good morning.")),
    ("stt", x.Stt(text="good morning", session_id="s1")),
    ("llm", x.Llm(emotion="happy", text="🙂")),
    ("mcp", x.ServerMcp(payload=x.McpRequest(id=10000, method="tools/list", params={"cursor": ""}))),
    ("system", x.System(command="reboot")),
    ("alert", x.Alert(status="error", message="offline", emotion="sad")),
    ("mode_set", x.ModeSet(session_id="s1", mode="SHADOWING", task_instance_id="i1")),
    ("task", x.ServerTask(type="task.start", session_id="s1", task_instance_id="i1", app_id="english_learning", task_id="shadowing", lesson_id="unit01")),
    ("step_start", x.ServerStep(session_id="s1", task_instance_id="i1", step_id="i1:0", action="listen", timeout_ms=2568)),
]  # fmt: skip

_TASK: list[tuple[str, b.TaskEvent]] = [
    ("window_opened", b.WindowOpened(ts=TS, device=DEV, instance_id="i1", step_index=0, data=b.WindowOpenedData(window_ms=2568, planned_close_ms=TS + 2568))),
    ("window_closed", b.WindowClosed(ts=TS, device=DEV, instance_id="i1", step_index=0, data=b.WindowClosedData(planned_close_ms=TS, actual_close_ms=TS + 2, lateness_ms=2, window_ms=2568))),
    ("instance_cancelled", b.InstanceCancelled(ts=TS, device=DEV, instance_id="i1", data=b.CancelledData(reason="preempted"))),
    ("presence_changed", b.PresenceChanged(ts=TS, device=DEV, data=b.PresenceData(online=False))),
    ("step_signals", b.StepSignalsEvent(ts=TS, device=DEV, instance_id="i1", step_index=2, data=b.StepSignalsData(response_latency_ms=640, completed=1))),
    ("step_signals_silent", b.StepSignalsEvent(ts=TS, device=DEV, instance_id="i1", step_index=3, data=b.StepSignalsData(response_latency_ms=None, completed=0))),
    ("instance_signals", b.InstanceSignalsEvent(ts=TS, device=DEV, instance_id="i1", data=b.InstanceSignalsData(steps=10, responded=9, completed=8, mean_latency_ms=850, totals={"correct": 7.0, "answered": 9.0}))),
    *[
        (name, b.TaskLifecycle(ts=TS, device=DEV, event=name, instance_id="i1", data={"clip": "01.mp3"}))  # type: ignore[arg-type]
        for name in ("instance.started", "instance.paused", "instance.resumed", "instance.completed", "step.played", "step.failed", "speech.started", "speech.stopped")
    ],
]  # fmt: skip

SAMPLES: list[Sample] = [
    *(Sample(f"cmd.{n}", "snlp.command", parse_command, m) for n, m in _COMMANDS),
    Sample("ack", "snlp.ack", _board(TopicKind.ACK), s.Ack(id="a1", ts=TS, ref="c1", cmd="PLAY_MEDIA", status="accepted")),
    Sample("ack.busy", "snlp.ack", _board(TopicKind.ACK), s.Ack(ref="c9", cmd="PLAY_MEDIA", status="busy", code=409, current_ref="c1", current_prio=3)),
    Sample("rpt.progress", "snlp.report", _board(TopicKind.RPT), s.Report(ref="c3", cmd="DOWNLOAD", stage="progress", bytes=61728, total=123456)),
    Sample("rpt.done", "snlp.report", _board(TopicKind.RPT), s.Report(ref="c3", cmd="DOWNLOAD", stage="done", ok=True, bytes=123456, sha256=SHA)),
    Sample("rpt.failed", "snlp.report", _board(TopicKind.RPT), s.Report(ref="c3", cmd="DOWNLOAD", stage="done", ok=False, code="SHA_MISMATCH")),
    *(Sample(f"evt.{n}", "snlp.event", _board(TopicKind.EVT), m) for n, m in _EVENTS),
    Sample("hb", "snlp.heartbeat", _board(TopicKind.HB), s.Heartbeat(id="h1", ts=TS, up_ms=8123456, rssi=-61, heap=81234, sd_free_mb=512, playing=s.Playing(ref="c1", name="a.mp3", prio=3), fw="1.2.3")),
    Sample("hb.empty", "snlp.heartbeat", _board(TopicKind.HB), s.Heartbeat(playing=False)),
    Sample("status", "snlp.status", _board(TopicKind.STATUS), s.BoardStatus(online=True, session="boot-7", ts=TS, by="board")),
    *(Sample(f"xiaozhi.up.{n}", f"xiaozhi.up.{n.split('_detect')[0].split('_speech')[0]}", parse_xiaozhi, m) for n, m in _UP),
    *(Sample(f"xiaozhi.down.{n}", f"xiaozhi.down.{n}", parse_xiaozhi_downlink, m) for n, m in _DOWN),
    Sample("ctl.start", "snlpgw.ctl_request", _gw(TopicKind.CTL), b.CtlRequest(v=1, id="r1", action="start", app_id="english_learning", task_id="shadowing", lesson_id="unit01", params={"listen_ratio": 1.3}, source="parent-app")),
    Sample("ctl.sync", "snlpgw.ctl_request", _gw(TopicKind.CTL), b.CtlRequest(v=1, id="r3", action="sync", app_id="english_learning", task_id="shadowing", lesson_id="unit01")),
    Sample("ctl.stop", "snlpgw.ctl_request", _gw(TopicKind.CTL), b.CtlRequest(v=1, id="r2", action="stop", instance_id="i1", priority=2)),
    Sample("reply.accepted", "snlpgw.ctl_reply", _gw(TopicKind.REPLY), b.CtlReply(ref="r1", device=DEV, action="start", status="accepted", instance_id="i1", ts=TS)),
    Sample("reply.refused", "snlpgw.ctl_reply", _gw(TopicKind.REPLY), b.CtlReply(ref="r1", device=DEV, action="start", status="refused", reason="busy", running_priority=3, detail="instance i0 running", ts=TS)),
    Sample("reply.unreadable", "snlpgw.ctl_reply", _gw(TopicKind.REPLY), b.CtlReply(ref=None, device=DEV, action=None, status="refused", reason="invalid", detail="malformed_json", ts=TS)),
    *(Sample(f"task.{n}", "snlpgw.task_event", _gw(TopicKind.TASK), m) for n, m in _TASK),
    Sample("assessment", "snlpgw.assessment", _gw(TopicKind.ASSESSMENT), b.Assessment(instance_id="i1", step_index=0, device=DEV, prompt_text="/english_learning/shadowing/lessons/unit01/01.mp3", expected_text="Good morning.", asr_text="good morning", metrics=[b.Metric(method="text_similarity_v0", value=1.0)], assessed_at=TS, clip="01.mp3", ts=TS)),
    Sample("assessment.unassessed", "snlpgw.assessment", _gw(TopicKind.ASSESSMENT), b.Assessment(instance_id="i1", step_index=1, device=DEV, prompt_text="02.mp3", expected_text=None, asr_text=None, metrics=[], assessed_at=TS)),
    Sample("ops.metrics", "snlpgw.ops_metrics", _gw(TopicKind.OPS_METRICS), o.OpsMetrics(gateway_id="gw-1", ts=TS, interval_s=10, metrics={"snlpgw_devices_online": 3.0, 'snlpgw_udp_dropped_total{reason="replay"}': 1.0})),
    Sample("ops.event", "snlpgw.ops_event", _gw(TopicKind.OPS_EVENTS), o.OpsEvent(gateway_id="gw-1", ts=TS, alarm=o.Alarm.ACK_TIMEOUT, device=DEV, detail={"cmd_id": "c1", "attempts": 3})),
    Sample("gw.status", "snlpgw.gateway_status", _gw(TopicKind.GW_STATUS), o.GatewayStatus(online=True, gateway_id="gw-1", ts=TS)),
]  # fmt: skip
