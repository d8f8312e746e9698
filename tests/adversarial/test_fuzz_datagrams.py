"""Datagram fuzzing at the real UDP endpoint (issue 10 acceptance): more than 10,000 random and
malformed datagrams while a shadowing lesson runs on a board and a Xiaozhi device streams
speech beside them."""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import struct
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from codec.packet import MAX_DATAGRAM
from gateway.simulators.xiaozhi import MqttInfo, XiaozhiDeviceSim, encode_pcm
from tests.adversarial.udp_support import live_of, random_ssrc, ssrc_of
from tests.support import speech
from tests.support.broker import Broker, new_device_id
from tests.support.lesson_rig import LessonRig, lesson_rig
from tests.support.udp_watch import DatagramWatch
from topics import mac_colon

pytestmark = pytest.mark.integration

SEED = 20261201
PER_KIND = 2_100  # five kinds: 10,500 datagrams
WINDOW = 100  # datagrams in flight at most, so the kernel's socket buffer never overflows
HEADER = struct.Struct(">BBHIII")


class Fuzzer:
    """The attacker: its own provisioned device (so keyless payloads reach a decoder through
    its own session) and the victim's ssrc, which it has observed on the wire."""

    def __init__(self, rng: random.Random, own: XiaozhiDeviceSim, victim_ssrc: int) -> None:
        self.rng = rng
        self.own = own
        self.own_ssrc = ssrc_of(own)
        self.victim_ssrc = victim_ssrc
        self.seq = 1

    def ssrc(self) -> int:
        return self.rng.choice((self.own_ssrc, self.victim_ssrc, random_ssrc(), 0, 0xFFFFFFFF))

    def random_bytes(self) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, MAX_DATAGRAM + 100))

    def header_bad_payload(self) -> bytes:
        body = self.rng.randbytes(self.rng.randint(0, 400))
        length = len(body) if self.rng.random() < 0.5 else self.rng.randint(0, 0xFFFF)
        flags = self.rng.choice((0, 0, 0x80, self.rng.randint(0, 255)))
        ptype = 1 if self.rng.random() < 0.9 else self.rng.randint(0, 255)
        seq = self.rng.randint(0, 0xFFFFFFFF)
        return HEADER.pack(ptype, flags, length, self.ssrc(), 0, seq) + body

    def own_session_wrong_key(self) -> bytes:
        """Framed right for the attacker's own session (and, a fifth of the time, the
        victim's), fresh-looking sequence numbers, payload not sealed with the key."""
        roll = self.rng.random()
        if roll < 0.1:
            seq = self.rng.randint(0, 0xFFFFFFFF)
        elif roll < 0.2:
            seq = max(0, self.seq - self.rng.randint(0, 5))  # replays
        else:
            self.seq += self.rng.randint(1, 8)
            seq = self.seq
        ssrc = self.victim_ssrc if self.rng.random() < 0.2 else self.own_ssrc
        body = self.rng.randbytes(self.rng.randint(0, 300))
        return HEADER.pack(1, 0, len(body), ssrc, self.rng.randint(0, 0xFFFFFFFF), seq) + body

    def truncated(self) -> bytes:
        assert self.own.crypto is not None
        self.own.crypto.local_sequence = self.seq
        datagram = self.own.crypto.seal(self.rng.randbytes(self.rng.randint(1, 300)))
        return datagram[: self.rng.randint(0, len(datagram) - 1)]

    def oversized(self) -> bytes:
        body = self.rng.randbytes(self.rng.randint(MAX_DATAGRAM - 15, 9000))
        return HEADER.pack(1, 0, len(body) & 0xFFFF, self.ssrc(), 0, self.seq + 1) + body

    def kinds(self) -> list[Callable[[], bytes]]:
        return [
            self.random_bytes,
            self.header_bad_payload,
            self.own_session_wrong_key,
            self.truncated,
            self.oversized,
        ]


def sample(rig: LessonRig, name: str, **labels: str) -> float:
    value = rig.gw.service.metrics.registry.get_sample_value(f"snlpgw_{name}", labels)
    return 0.0 if value is None else value


def drops_by_reason(rig: LessonRig) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in rig.gw.service.metrics.registry.collect():
        for s in family.samples:
            if s.name == "snlpgw_xiaozhi_udp_dropped_total":
                out[s.labels["reason"]] = s.value
    return out


def xiaozhi_device(broker: Broker) -> XiaozhiDeviceSim:
    """A Xiaozhi device with harness-made broker credentials (the rig's gateway keeps its
    broker files apart from the broker's, so OTA is not the way in here)."""
    dev = new_device_id()
    creds = broker.provision(dev)
    sim = XiaozhiDeviceSim(mac=mac_colon(dev))
    sim.mqtt_info = MqttInfo(
        endpoint=f"{broker.host}:{broker.port}",
        client_id=f"GID_test@@@{dev}@@@{uuid.uuid4()}",
        username=creds.username,
        password=creds.password,
        publish_topic=f"device-server/{dev}",
        subscribe_topic=f"devices/p2p/{dev}",
    )
    return sim


async def test_ten_thousand_random_datagrams_leave_the_lesson_and_the_device_untouched(
    broker: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Attack: 10,500 datagrams at the UDP port — random bytes, valid headers with bad payloads,
    keyless payloads for the attacker's own and the victim's ssrc, truncated and oversized ones.
    Defence: nothing crashes or logs an error, every datagram is either accepted by its own
    session or dropped and counted by reason, the streaming device's session is unchanged and
    the lesson on the board runs every step."""
    caplog.set_level(logging.ERROR)
    timeline = speech.compose([400, "I keep talking.", 900, "Through all of it.", 900])
    victim_frames = encode_pcm(timeline.pcm)
    async with lesson_rig(broker, tmp_path, durations_ms=(1500, 1500, 1500, 1500)) as rig:
        victim, own = xiaozhi_device(broker), xiaozhi_device(broker)
        async with victim, own:
            await victim.open_audio_channel()
            await own.open_audio_channel()
            channel = rig.gw.xiaozhi
            for sim in (victim, own):  # decode + VAD on (the runtime turns it on in windows)
                channel.set_listening(sim.mac.replace(":", "_"), True)
            watch = DatagramWatch(channel)
            reply = await rig.start()
            fuzzer = Fuzzer(random.Random(SEED), own, ssrc_of(victim))
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as evil:
                evil.bind(("127.0.0.1", 0))
                assert own.hello is not None
                assert own.crypto is not None
                target = (own.hello.server, own.hello.port)
                evil.sendto(own.crypto.seal(b"\xf8\xff\xfe"), target)  # binds its own session

                async def fuzz() -> int:
                    sent = 1
                    kinds = fuzzer.kinds()
                    for n in range(PER_KIND * len(kinds)):
                        evil.sendto(kinds[n % len(kinds)](), target)
                        sent += 1
                        if sent % WINDOW == 0:
                            floor = sent - WINDOW
                            await watch.until(
                                lambda f=floor: sample(rig, "xiaozhi_udp_packets_in_total") >= f
                            )
                    return sent

                async with asyncio.TaskGroup() as tg:
                    tg.create_task(victim.stream_opus(victim_frames), name="test.victim-stream")
                    fuzzing = tg.create_task(fuzz(), name="test.fuzz")
                total = fuzzing.result() + len(victim_frames)
                await watch.until(lambda: sample(rig, "xiaozhi_udp_packets_in_total") == total)
            victim_live, own_live = live_of(channel, victim), live_of(channel, own)
            accepted = victim_live.receiver.accepted + own_live.receiver.accepted
            drops = drops_by_reason(rig)
            # Every datagram is accounted for: accepted by its session or dropped by reason.
            assert sum(drops.values()) + accepted == total
            for reason in (
                "too_short",
                "too_large",
                "bad_type",
                "length_mismatch",
                "unknown_ssrc",
                "foreign_source",
                "bad_flags",
                "replay",
                "seq_jump",
                "rate_limited",
            ):
                assert drops.get(reason, 0) > 0, (reason, drops)
            # The victim's session saw exactly its own stream.
            assert victim_live.receiver.accepted == len(victim_frames)
            assert victim_live.receiver.drops.total() == 0
            assert victim_live.receiver.last_seq == len(victim_frames)
            assert victim_live.binding.rebinds == 0
            assert channel.session_id(victim.mac.replace(":", "_")) == victim_live.session_id
            # The lesson ran every step.
            iid = reply["instance_id"]
            await rig.wait_event("instance.completed", instance_id=iid, wait_s=60)
            for step in range(4):
                assert rig.find_event("window.opened", step, instance_id=iid) is not None
                assert rig.find_event("window.closed", step, instance_id=iid) is not None
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
