"""CHAT bridged to a xiaozhi server: a real gateway between a firmware-like device (MQTT + AES
UDP) and a real WebSocket peer speaking the xiaozhi server protocol (tests/support).

The uplink Opus reaches the peer byte for byte, the peer's TTS reaches the device decrypted and
in order, control is relayed both ways with each side's own session id; a lesson suspends the
bridge and its exit resumes it; the upstream going down ends in a goodbye and an alarm.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gateway.chat.cues import build_cues
from gateway.chat.voice import CueKind
from gateway.simulators.xiaozhi import SIM_TOOLS, encode_pcm
from tests.support.broker import Broker
from tests.support.chat_rig import TOKEN, ChatRig, chat_rig
from tests.support.speech import silence, synthesize
from tests.support.xiaozhi_server import PeerSession

CUES = build_cues()
SEGMENT_END, START = CUES[CueKind.SEGMENT_END], CUES[CueKind.START]


async def _listening(rig: ChatRig) -> PeerSession:
    """Hello + ``listen start`` (auto); returns the peer session the listen arrived on."""
    peer = rig.upstream
    seen = len(peer.sessions)
    await rig.device.open_audio_channel()
    await rig.device.listen_start("auto")

    def relayed() -> PeerSession | None:
        return next((s for s in peer.sessions[seen:] if s.named("listen", state="start")), None)

    await peer.wait_for(lambda: relayed() is not None, "listen start relayed")
    found = relayed()
    assert found is not None
    return found


async def test_uplink_byte_for_byte_and_tts_in_order(broker: Broker, tmp_path: Path) -> None:
    async with chat_rig(broker, tmp_path) as rig:
        hello = await rig.device.open_audio_channel()
        peer = await rig.upstream.session(0)
        # What a MQTT gateway sends the xiaozhi server (reference §9).
        assert peer.query == {"from": "mqtt_gateway"}
        assert peer.headers["device-id"] == rig.device.mac  # the firmware's: its MAC
        assert peer.headers["client-id"] == rig.uuid  # its UUID, as the firmware sends it
        assert peer.headers["protocol-version"] == "2"
        assert peer.headers["authorization"] == f"Bearer {TOKEN}"
        assert peer.hello is not None
        assert peer.hello["transport"] == "websocket"
        assert peer.hello["audio_params"]["sample_rate"] == 16000
        assert peer.hello["features"] == {"mcp": True, "glyph_push": False}  # the device's own
        assert hello.sample_rate == 16000  # v0.9.6 echoes the client's audio params

        await rig.device.listen_start("auto")
        await rig.upstream.wait_for(lambda: bool(peer.named("listen")), "listen relayed")
        (listen,) = peer.named("listen")
        assert listen["session_id"] == peer.session_id  # rewritten to the upstream's id
        assert listen["state"] == "start"
        assert listen["mode"] == "auto"

        said = encode_pcm(synthesize("Good morning, how are you?"))
        await rig.device.stream_opus(said)
        await rig.upstream.wait_for(lambda: len(peer.audio) >= len(said), "uplink frames")
        assert peer.audio == said  # unchanged: no re-encode, nothing lost, nothing reordered
        assert peer.bad_frames == 0

        reply = encode_pcm(synthesize("Hello! Nice to hear you. I am fine, thank you."))
        await peer.speak(reply, heard="good morning how are you")
        stop = await rig.device.expect("tts", state="stop")
        # tts stop (MQTT) leaves after the last datagram, but the device reads its two sockets
        # in whatever order the loop serves them: wait for the audio, then compare it whole.
        # the server's stt is the segment's end (its cue first); its speech leads into
        # listening, so it ends with the start cue (voice-session v1 §1.4, §1.6)
        expected = [*SEGMENT_END, *reply, *START]
        await rig.device.wait_audio(len(expected), timeout_s=30.0)
        assert rig.device.downlink_audio == expected  # decrypted by the device, in order
        assert rig.device.crypto is not None
        assert rig.device.crypto.drops == {}
        for kind in ("stt", "llm", "tts"):
            msg = await rig.device.expect(kind)
            assert msg["session_id"] == hello.session_id  # the device's own id again
        assert stop["session_id"] == hello.session_id
        assert (await rig.device.expect("stt"))["text"] == "good morning how are you"

        # mcp from the device goes up too (rewritten like every other control message)
        await rig.device.send_json(
            type="mcp", payload={"jsonrpc": "2.0", "method": "notifications/x"}
        )
        await rig.upstream.wait_for(lambda: bool(peer.named("mcp")), "mcp relayed")
        assert peer.named("mcp")[0]["session_id"] == peer.session_id


async def test_no_uplink_while_tts_plays(broker: Broker, tmp_path: Path) -> None:
    async with chat_rig(broker, tmp_path) as rig:
        peer = await _listening(rig)
        await peer.send_json(type="stt", text="hello")  # the upstream's VAD ended the segment
        await peer.send_json(type="tts", state="start")
        await rig.device.expect("tts", state="start")
        # one turn at a time: the device's audio during the reply is not uploaded
        await rig.device.stream_opus(encode_pcm(silence(600)), speed=4.0)
        await peer.send_json(type="tts", state="stop")
        await rig.device.expect("tts", state="stop")
        await rig.device.listen_start("auto")  # the firmware listens again after tts stop
        await rig.upstream.wait_for(lambda: len(peer.named("listen")) >= 2, "second listen")
        again = encode_pcm(synthesize("Thank you."))
        await rig.device.stream_opus(again)
        await rig.upstream.wait_for(lambda: len(peer.audio) >= len(again), "second turn audio")
        assert peer.audio == again  # only the new turn's frames; none from the reply time


@pytest.mark.parametrize("exit_by", ["stop", "long_press"])
async def test_lesson_suspends_chat_and_exit_resumes(
    broker: Broker, tmp_path: Path, exit_by: str
) -> None:
    async with chat_rig(broker, tmp_path) as rig:
        first = await _listening(rig)
        reply = await rig.lesson.start(priority=2)
        assert reply["status"] == "accepted"
        await rig.upstream.wait_for(lambda: first.closed, "bridge closed by the lesson")
        assert rig.chat_state() == "suspended"
        await rig.lesson.wait_command("PLAY_MEDIA")
        # mid-lesson the device's audio belongs to the lesson, not to the chat server
        await rig.device.stream_opus(encode_pcm(synthesize("Good morning.")), speed=2.0)
        assert first.audio == []
        assert len(rig.upstream.sessions) == 1  # no chat session while the lesson runs

        if exit_by == "stop":
            stopped = await rig.lesson.request("stop", instance_id=reply["instance_id"], priority=2)
            assert stopped["status"] == "accepted"
        else:
            rig.lesson.board.press_button("long")
        cancelled = await rig.lesson.wait_event("instance.cancelled")
        assert cancelled.data["reason"] == {"stop": "stopped", "long_press": "button"}[exit_by]
        # back in CHAT: the device talks again within one hello
        second = await _listening(rig)
        said = encode_pcm(synthesize("Hello again."))
        await rig.device.stream_opus(said)
        await rig.upstream.wait_for(lambda: len(second.audio) >= len(said), "audio after exit")
        assert second.audio == said


async def test_upstream_down_goodbye_and_alarm(broker: Broker, tmp_path: Path) -> None:
    async with chat_rig(broker, tmp_path) as rig:
        hello = await rig.device.open_audio_channel()
        await rig.upstream.session(0)
        await rig.upstream.stop()
        bye = await rig.device.expect("goodbye")
        assert bye["session_id"] == hello.session_id  # honoured by v2.3+ firmware
        alarm = await rig.lesson.wait_alarm("chat_upstream_lost")
        assert alarm.body["device"] == rig.dev
        # the next hello is answered at once with a goodbye while the server stays down
        seen = len(rig.device.inbox)
        again = await rig.device.open_audio_channel()
        bye = await rig.device.expect("goodbye", after=seen)
        assert bye["session_id"] == again.session_id


async def test_silence_goes_to_standby_and_speech_resets_it(broker: Broker, tmp_path: Path) -> None:
    # ~7 s of speech from the listen start: longer than the timeout, which our VAD resets;
    # the tail of silence lets the VAD close the utterance, then 5 s of nothing → standby.
    # Synthesized and encoded before the listen starts the 5 s timer (espeak-ng and the Opus
    # encoder took longer than that on two loaded cores, and the device fell silent meanwhile).
    speech = synthesize("Good morning, how are you? I would like to hear a long story today.")
    said = encode_pcm(silence(300) + speech + speech + silence(900))
    async with chat_rig(broker, tmp_path, silence_timeout_s=5.0) as rig:
        peer = await _listening(rig)
        assert rig.device.hello is not None
        session_id = rig.device.hello.session_id
        await rig.device.stream_opus(said)
        bye = await rig.device.expect("goodbye", timeout_s=20)
        assert bye["session_id"] == session_id
        assert peer.audio == said  # no timeout cut the speech
        await rig.upstream.wait_for(lambda: peer.closed, "bridge closed at standby")
        assert rig.lesson.metric('chat_standby_total{reason="silence"}') == 1


async def test_server_ending_the_chat_says_goodbye_after_its_audio(
    broker: Broker, tmp_path: Path
) -> None:
    async with chat_rig(broker, tmp_path) as rig:
        peer = await _listening(rig)
        assert rig.device.hello is not None
        # the device's first datagram tells the gateway where to send audio (reference §5.5)
        await rig.device.stream_opus(encode_pcm(silence(300)), speed=4.0)
        reply = encode_pcm(synthesize("Goodbye, see you soon."))
        await peer.speak(reply, heard="goodbye")
        await peer.ws.close()  # xiaozhi-esp32-server closes after its exit intent (code 1000)
        bye = await rig.device.expect("goodbye")
        assert bye["session_id"] == rig.device.hello.session_id
        # The goodbye left after the last datagram. The audio is paced over seconds, so a
        # goodbye sent early would find next to none of it played; the last few datagrams may
        # still sit unread in the device's UDP socket (it serves two sockets), so wait for them.
        assert len(rig.device.downlink_audio) >= len(reply) // 2
        # cues around it: the server's close comes after its tts stop (nothing tells the
        # gateway earlier that this speech will not lead into listening)
        expected = [*SEGMENT_END, *reply, *START]
        await rig.device.wait_audio(len(expected), timeout_s=30.0)
        assert rig.device.downlink_audio == expected  # the goodbye waited for the audio
        assert rig.lesson.metric('chat_upstream_ends_total{reason="ended"}') == 1
        assert rig.lesson.metric('ops_alarms_total{alarm="chat_upstream_lost"}') == 0


async def test_a_stopped_chat_hands_out_no_closed_device(broker: Broker, tmp_path: Path) -> None:
    """At stop every device's chat is closed AND forgotten: a hello racing the shutdown must not
    reach a closed DeviceChat (its timers and downlink gone)."""
    async with chat_rig(broker, tmp_path) as rig:
        await _listening(rig)
        chat = rig.lesson.gw.chat
        assert chat is not None
        assert chat.device(rig.dev) is not None
    assert chat.device(rig.dev) is None


async def test_device_tools_reach_the_status_route_after_connect(
    broker: Broker, tmp_path: Path
) -> None:
    """The server asks the device's tools at connect (``initialize``, ``tools/list``); the
    answer passes through the gateway, which keeps it with the hello's features."""
    async with chat_rig(broker, tmp_path) as rig:
        path = f"/admin/devices/{rig.dev}/status"
        assert (await rig.lesson.http_get(path))[0] == 404  # not heard yet
        before = time.time()
        await rig.device.open_audio_channel()
        peer = await rig.upstream.session(0)
        await rig.upstream.wait_for(lambda: bool(peer.tools), "the device's tools/list answer")
        status, body = await rig.lesson.http_get(path)
        assert status == 200
        assert body["device"] == rig.dev
        assert body["features"] == {"mcp": True, "glyph_push": False}
        assert before <= body["hello_at"] <= body["mcp"]["seen_at"] <= time.time()
        (tool,) = SIM_TOOLS
        assert body["mcp"]["tools"] == [
            {"name": tool["name"], "description": tool["description"], "params": []}
        ]
        assert body["mcp"]["complete"] is True
        assert body["mcp"]["cut"] == {"tools": 0, "text": 0}
        unknown = await rig.lesson.http_get("/admin/devices/aa_bb_cc_dd_ee_ff/status")
        assert unknown[0] == 404


async def test_each_side_sees_only_its_own_session_id(broker: Broker, tmp_path: Path) -> None:
    """The device keeps the gateway's session id, the server its own (docs/chat.md, "Session
    ids"): every message is rewritten both ways, neither id ever reaches the other side."""
    async with chat_rig(broker, tmp_path) as rig:
        hello = await rig.device.open_audio_channel()
        peer = await rig.upstream.session(0)
        device_sid, server_sid = hello.session_id, peer.session_id
        assert device_sid
        assert server_sid
        assert device_sid != server_sid
        await rig.upstream.wait_for(lambda: bool(peer.tools), "tools/list answered")
        call = {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": SIM_TOOLS[0]["name"], "arguments": {}},
        }
        await peer.send_json(type="mcp", payload=call)
        await rig.upstream.wait_for(
            lambda: any(m.get("id") == 3 for m in peer.device_mcp), "tools/call answered"
        )
        await rig.device.listen_start("auto")
        await rig.upstream.wait_for(lambda: bool(peer.named("listen")), "listen relayed")
        await peer.speak(encode_pcm(synthesize("Fine, thanks.")), heard="how are you")
        await rig.device.expect("tts", state="stop")
        await rig.device.listen_stop()
        await rig.upstream.wait_for(
            lambda: bool(peer.named("listen", state="stop")), "listen stop relayed"
        )

        down = rig.device.inbox  # everything the device was sent over MQTT
        assert {"hello", "mcp", "stt", "tts", "llm"} <= {m["type"] for m in down}
        assert {m.get("session_id") for m in down} == {device_sid}
        assert server_sid not in json.dumps(down)
        up = peer.messages  # everything the server was sent after the hello
        assert {"mcp", "listen"} <= {m["type"] for m in up}
        assert {m.get("session_id") for m in up} == {server_sid}
        sent_to_server = json.dumps([peer.hello, up, peer.headers, peer.path_qs])
        assert device_sid not in sent_to_server
