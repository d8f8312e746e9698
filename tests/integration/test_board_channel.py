"""Board channel end to end: real Mosquitto (project config, auth + ACL), the gateway's real
service and MQTT connection, and board simulators as real MQTT 3.1.1 clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from devstack.gateway import gateway_settings, serving
from gateway.board.channel import BoardChannel, BoardEventSink
from gateway.board.model import (
    AudioEventKind,
    BoardAudio,
    BoardEvent,
    OutcomeKind,
    PresenceChange,
)
from gateway.service import Context, Service
from gateway.simulators.board import BoardSimulator, SimOptions
from tests.support.broker import Broker, new_device_id
from tests.support.mqtt_client import ClientSession, mqtt_client
from topics.snlp_commands import PlayMedia, StopMedia

pytestmark = pytest.mark.integration
WAIT_S = 15.0


@dataclass
class RecordingSink:
    """The runtime's side of the channel, recording; waits are bounded and event-driven."""

    also: BoardEventSink | None = None  # told everything too (e.g. the task shell's adapter)
    events: list[BoardEvent] = field(default_factory=list)
    changes: list[PresenceChange] = field(default_factory=list)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def board_event(self, event: BoardEvent) -> None:
        self.events.append(event)
        if self.also is not None:
            self.also.board_event(event)
        asyncio.get_running_loop().create_task(self._notify(), name="sink.notify")

    def presence_changed(self, change: PresenceChange) -> None:
        self.changes.append(change)
        if self.also is not None:
            self.also.presence_changed(change)
        asyncio.get_running_loop().create_task(self._notify(), name="sink.notify")

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        async with asyncio.timeout(WAIT_S), self._changed:
            await self._changed.wait_for(predicate)

    def audio(self, dev: str, kind: AudioEventKind, ref: str | None = None) -> list[BoardEvent]:
        return [
            e
            for e in self.events
            if e.dev == dev
            and isinstance(e.body, BoardAudio)
            and e.body.kind is kind
            and (ref is None or e.ref == ref)
        ]

    def online(self, dev: str) -> bool | None:
        mine = [c.online for c in self.changes if c.dev == dev]
        return mine[-1] if mine else None


@dataclass
class ChannelRig:
    broker: Broker
    channel: BoardChannel
    sink: RecordingSink
    service: Service
    tg: asyncio.TaskGroup
    tmp: Path
    sims: list[asyncio.Task[None]] = field(default_factory=list)

    def simulator(self, dev: str, **options: object) -> BoardSimulator:
        creds = self.broker.provision(dev)
        sim = BoardSimulator(
            dev,
            host=self.broker.host,
            port=self.broker.port,
            username=creds.username,
            password=creds.password,
            options=SimOptions(**options),  # type: ignore[arg-type]
        )
        self.sims.append(self.tg.create_task(sim.run(), name=f"device[{dev}].sim"))
        return sim

    def metric(self, key: str) -> float:
        return self.service.metrics.snapshot().get(f"snlpgw_{key}", 0.0)


@contextlib.asynccontextmanager
async def gateway(
    broker: Broker, tmp: Path, *, also: BoardEventSink | None = None, **board: object
) -> AsyncIterator[ChannelRig]:
    """A real gateway service with the board channel; simulators run in ``rig.tg``; ``also``
    hears what the channel reports, after the recording sink."""
    settings = gateway_settings(broker, tmp, board=board)
    sink = RecordingSink(also)
    ctx = Context.create(settings)
    channel = BoardChannel(
        settings=settings.board,
        router=ctx.mqtt,
        publisher=ctx.mqtt,
        metrics=ctx.metrics,
        alarms=ctx.ops,
        sink=sink,
    )
    async with serving(Service(ctx, [channel])) as service, asyncio.TaskGroup() as tg:
        rig = ChannelRig(broker, channel, sink, service, tg, tmp)
        try:
            yield rig
        finally:
            for task in rig.sims:
                task.cancel()


async def connected(sim: BoardSimulator, rig: ChannelRig) -> None:
    async with asyncio.timeout(WAIT_S):
        await sim.connected.wait()
    await rig.sink.wait_for(lambda: rig.sink.online(sim.dev) is True)


def make_wav(path: Path, seconds: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["sox", "-n", "-r", "16000", "-c", "1", str(path), "synth", str(seconds), "sine", "440"],
        check=True,
    )


async def test_play_media_acked_then_completed_with_real_duration(
    broker: Broker, tmp_path: Path
) -> None:
    media = tmp_path / "media"
    make_wav(media / "lessons/u1/01.wav", 0.4)
    async with gateway(broker, tmp_path) as rig:
        dev = new_device_id()
        sim = rig.simulator(dev, media_dir=media, heartbeat_s=5.0)
        await connected(sim, rig)
        outcome = await asyncio.wait_for(
            rig.channel.send(dev, PlayMedia(name="/lessons/u1/01.wav")), WAIT_S
        )
        assert outcome.kind is OutcomeKind.ACCEPTED
        await rig.sink.wait_for(lambda: bool(rig.sink.audio(dev, AudioEventKind.COMPLETED)))
        (done,) = rig.sink.audio(dev, AudioEventKind.COMPLETED)
        assert done.ref == outcome.id
        assert done.body == BoardAudio(
            AudioEventKind.COMPLETED, name="/lessons/u1/01.wav", duration_ms=400, reason="eof"
        )
        assert rig.sink.audio(dev, AudioEventKind.STARTED, outcome.id)

        # repeat 3: one command, one completion after three loops, duration = total
        outcome = await asyncio.wait_for(
            rig.channel.send(dev, PlayMedia(name="/lessons/u1/01.wav", repeat=3)), WAIT_S
        )
        await rig.sink.wait_for(
            lambda: bool(rig.sink.audio(dev, AudioEventKind.COMPLETED, outcome.id))
        )
        (done,) = rig.sink.audio(dev, AudioEventKind.COMPLETED, outcome.id)
        assert isinstance(done.body, BoardAudio)
        assert done.body.duration_ms == 1200
        assert [c["id"] for c in sim.received].count(outcome.id) == 1
        # a later command's ack proves no other completion of that play was on its way first
        await asyncio.wait_for(rig.channel.send(dev, StopMedia()), WAIT_S)
        assert len(rig.sink.audio(dev, AudioEventKind.COMPLETED, outcome.id)) == 1
        assert rig.metric('board_commands_acked_total{cmd="PLAY_MEDIA",status="accepted"}') == 2


async def test_dropped_acks_resend_same_id_executed_once(broker: Broker, tmp_path: Path) -> None:
    async with gateway(broker, tmp_path, ack_timeout_s=0.3, max_resends=3) as rig:
        dev = new_device_id()
        sim = rig.simulator(
            dev, drop_acks=2, drop_events=1, durations={"a.mp3": 300}, heartbeat_s=5.0
        )
        await connected(sim, rig)
        outcome = await asyncio.wait_for(rig.channel.send(dev, PlayMedia(name="a.mp3")), WAIT_S)
        assert outcome.kind is OutcomeKind.DUPLICATE
        assert outcome.delivered
        assert outcome.sends == 3
        assert [c["id"] for c in sim.received] == [outcome.id] * 3
        assert sim.executed == {outcome.id: 1}
        await rig.sink.wait_for(lambda: bool(rig.sink.audio(dev, AudioEventKind.COMPLETED)))
        assert rig.sink.audio(dev, AudioEventKind.STARTED) == []  # the dropped event (fault)
        assert sim.stats["events_dropped"] == 1
        assert rig.metric('board_commands_resent_total{cmd="PLAY_MEDIA"}') == 2


async def test_pipelined_commands_reach_the_board_in_order_and_none_waits_for_an_ack(
    broker: Broker, tmp_path: Path
) -> None:
    async with gateway(broker, tmp_path, ack_timeout_s=4.0, max_in_flight=4) as rig:
        dev = new_device_id()
        sim = rig.simulator(dev, drop_acks=1, durations={"a.mp3": 60_000}, heartbeat_s=5.0)
        await connected(sim, rig)
        # The step boundary: LISTEN_STOP (its ack is lost) and the next PLAY_MEDIA together.
        stop = rig.channel.submit(dev, "LISTEN_STOP", {}, command_id="c1-listen-stop")
        play = rig.channel.submit(dev, "PLAY_MEDIA", {"name": "a.mp3"}, command_id="c2-play")
        outcome = await asyncio.wait_for(play, WAIT_S)
        assert outcome.kind is OutcomeKind.ACCEPTED
        assert not stop.done()  # the play did not wait for LISTEN_STOP's ack
        # More than the window at once: the board sees and executes them in submit order.
        ids = [f"c{i}-{cmd.lower()}" for i, cmd in enumerate(("STOP_MEDIA", "PLAY_MEDIA"), 3)]
        ids += [f"c{i}-sound" for i in range(5, 9)]
        later = [
            rig.channel.submit(dev, "STOP_MEDIA", {}, command_id=ids[0]),
            rig.channel.submit(dev, "PLAY_MEDIA", {"name": "a.mp3"}, command_id=ids[1]),
            *(rig.channel.submit(dev, "SOUND", {"type": "ding"}, command_id=i) for i in ids[2:]),
        ]
        for outcome in await asyncio.wait_for(asyncio.gather(*later), WAIT_S):
            assert outcome.kind is OutcomeKind.ACCEPTED
        # LISTEN_STOP's own deadline: resent with the same id, the board says duplicate.
        assert (await asyncio.wait_for(stop, WAIT_S)).kind is OutcomeKind.DUPLICATE
        received = [c["id"] for c in sim.received]
        assert received == ["c1-listen-stop", "c2-play", *ids, "c1-listen-stop"]
        assert sim.executed == dict.fromkeys(received, 1)
        audio = [(e["evt"], e["ref"]) for e in sim.sent_events if e["evt"].startswith("audio.")]
        assert audio == [
            ("audio.started", "c2-play"),
            ("audio.stopped", "c2-play"),  # STOP_MEDIA before the next PLAY_MEDIA, as sent
            ("audio.started", ids[1]),
        ]


async def test_offline_board_gets_queued_command_on_return_or_it_expires(
    broker: Broker, tmp_path: Path
) -> None:
    async with gateway(broker, tmp_path) as rig:
        dev = new_device_id()
        sim = rig.simulator(dev, heartbeat_s=5.0, durations={"a.mp3": 300})
        await connected(sim, rig)
        sim.go_offline()  # LWT: retained {"online": false} from the broker
        await rig.sink.wait_for(lambda: rig.sink.online(dev) is False)
        future = rig.channel.send(dev, PlayMedia(name="a.mp3"), ttl_ms=20_000)
        assert not future.done()
        assert sim.received == []
        sim.come_back()
        outcome = await asyncio.wait_for(future, WAIT_S)
        assert outcome.kind is OutcomeKind.ACCEPTED
        assert outcome.sends == 1
        assert sim.executed == {outcome.id: 1}

        sim.go_offline()
        await rig.sink.wait_for(lambda: rig.sink.online(dev) is False)
        outcome = await asyncio.wait_for(
            rig.channel.send(dev, PlayMedia(name="a.mp3"), ttl_ms=300), WAIT_S
        )
        assert outcome.kind is OutcomeKind.EXPIRED
        assert outcome.sends == 0
        assert rig.metric('board_commands_expired_total{cmd="PLAY_MEDIA"}') == 1
        assert rig.metric('ops_alarms_total{alarm="command_expired"}') == 1


async def test_legacy_text_event_is_the_same_typed_event(broker: Broker, tmp_path: Path) -> None:
    async with gateway(broker, tmp_path) as rig:
        dev = new_device_id()
        creds = broker.provision(dev)
        structured = {
            "v": 1,
            "id": "e1",
            "ts": 1,
            "ref": None,
            "evt": "audio.completed",
            "data": {"duration_ms": 2140, "reason": "eof"},
        }
        async with mqtt_client(broker, creds) as board:
            await board.publish(f"snlp/v1/{dev}/evt", json.dumps(structured))
            await board.publish(f"snlp/v1/{dev}/evt", b"[skill_event]completed|2140")
            await rig.sink.wait_for(lambda: len(rig.sink.audio(dev, AudioEventKind.COMPLETED)) == 2)
        first, second = rig.sink.audio(dev, AudioEventKind.COMPLETED)
        assert (first.legacy, second.legacy) == (False, True)
        assert (
            first.body
            == second.body
            == BoardAudio(AudioEventKind.COMPLETED, duration_ms=2140, reason="eof")
        )

        # and a board simulator in legacy mode drives the same completion
        dev2 = new_device_id()
        sim = rig.simulator(dev2, legacy=True, durations={"b.mp3": 300}, heartbeat_s=5.0)
        await connected(sim, rig)
        await asyncio.wait_for(rig.channel.send(dev2, PlayMedia(name="b.mp3")), WAIT_S)
        await rig.sink.wait_for(lambda: bool(rig.sink.audio(dev2, AudioEventKind.COMPLETED)))
        (done,) = rig.sink.audio(dev2, AudioEventKind.COMPLETED)
        assert done.legacy
        assert done.body == BoardAudio(AudioEventKind.COMPLETED, duration_ms=300, reason="eof")


async def test_presence_follows_heartbeats_and_retained_status(
    broker: Broker, tmp_path: Path
) -> None:
    # The board beats 10x faster than the gateway's period: only go_offline() silences it for
    # the 3 s the gateway needs to call it offline (with 0.3 s beats and a 0.9 s window, a
    # loop stall on two loaded cores made a spurious offline and rewrote the retained status).
    async with (
        gateway(broker, tmp_path, heartbeat_s=1.0, missed_heartbeats=3) as rig,
        mqtt_client(broker, broker.gateway_credentials()) as watcher,
    ):
        dev = new_device_id()
        topic = f"snlp/v1/{dev}/status"
        await watcher.subscribe(topic)
        sim = rig.simulator(dev, lwt=False, heartbeat_s=0.1)  # no LWT: the gateway writes status
        await connected(sim, rig)
        await status_seen(watcher, topic, online=True)
        sim.go_offline()
        await rig.sink.wait_for(lambda: rig.sink.online(dev) is False)
        assert [c.reason for c in rig.sink.changes if c.dev == dev][-1] == "missed_heartbeats"
        await status_seen(watcher, topic, online=False)
        assert await retained_status(rig, topic) == {"online": False, "by": "gateway"}
        sim.come_back()
        await rig.sink.wait_for(lambda: rig.sink.online(dev) is True)
        await status_seen(watcher, topic, online=True)
        assert await retained_status(rig, topic) == {"online": True, "by": "gateway"}
        assert rig.metric("board_devices_online") == 1


async def status_seen(watcher: ClientSession, topic: str, *, online: bool) -> None:
    """The gateway's status write reached the broker (so it is retained from now on)."""
    while json.loads((await watcher.expect(topic, wait_s=WAIT_S)).payload)["online"] is not online:
        pass


async def retained_status(rig: ChannelRig, topic: str) -> dict[str, object]:
    """Read the retained status as a new subscriber would."""
    async with mqtt_client(rig.broker, rig.broker.gateway_credentials()) as reader:
        await reader.subscribe(topic)
        message = await reader.expect(topic, wait_s=WAIT_S)
    assert message.retain
    body = json.loads(message.payload)
    return {"online": body["online"], "by": body.get("by")}


MALFORMED = [
    ("ack", b"{not json"),
    ("ack", b'{"v":1,"ref":"x","status":"maybe"}'),
    ("rpt", b'{"v":1,"ref":"x","stage":"done"}'),
    ("rpt", b"[1,2,3]"),
    ("evt", b'{"v":1,"evt":"sd.mounted","data":{}}'),
    ("evt", b"[skill_event]exploded|12"),
    ("evt", b"\xff\xfe\x00garbage"),
    ("hb", b'{"v":9}'),
    ("hb", b'"just a string"'),
    ("evt", b'{"v":1,"evt":"audio.completed","data":{"duration_ms":-5}}'),
]


async def test_malformed_flood_is_counted_and_harms_no_other_board(
    broker: Broker, tmp_path: Path
) -> None:
    async with gateway(broker, tmp_path) as rig:
        flooder, healthy = new_device_id(), new_device_id()
        sim = rig.simulator(healthy, durations={"a.mp3": 300}, heartbeat_s=5.0)
        await connected(sim, rig)
        async with mqtt_client(broker, broker.provision(flooder)) as board:
            for i in range(1000):
                kind, payload = MALFORMED[i % len(MALFORMED)]
                await board.publish(f"snlp/v1/{flooder}/{kind}", payload)
            # a valid event after the flood: same client, same order, so all 1000 came first
            await board.publish(f"snlp/v1/{flooder}/evt", b"[skill_event]completed|1")
            await rig.sink.wait_for(lambda: bool(rig.sink.audio(flooder, AudioEventKind.COMPLETED)))
        dropped = {
            k: v
            for k, v in rig.service.metrics.snapshot().items()
            if k.startswith("snlpgw_board_inbound_dropped_total")
        }
        assert sum(dropped.values()) == 1000
        assert (
            dropped['snlpgw_board_inbound_dropped_total{kind="ack",reason="malformed_json"}'] == 100
        )
        outcome = await asyncio.wait_for(rig.channel.send(healthy, PlayMedia(name="a.mp3")), WAIT_S)
        assert outcome.kind is OutcomeKind.ACCEPTED
        await rig.sink.wait_for(lambda: bool(rig.sink.audio(healthy, AudioEventKind.COMPLETED)))
