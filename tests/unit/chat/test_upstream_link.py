"""The upstream link against the xiaozhi server peer (real WebSockets on loopback): headers,
hello, framing versions, relays, failures and the retry back-off."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from gateway.chat.bridge import Backoff
from gateway.chat.framing import AudioFrame, Framing
from gateway.chat.upstream import UpstreamConfig, UpstreamError, UpstreamLink
from tests.support.xiaozhi_server import xiaozhi_server

OPUS = [bytes([n]) * (20 + n) for n in range(1, 6)]


class Got(list[Any]):
    """What the link delivered, awaitable."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()

    def append(self, item: Any) -> None:
        super().append(item)
        self.changed.set()

    async def until(self, count: int) -> None:
        async with asyncio.timeout(10):
            while len(self) < count:
                self.changed.clear()
                await self.changed.wait()


async def outcome(up: UpstreamLink, errors: list[UpstreamError]) -> None:
    try:
        await up.run()
    except UpstreamError as exc:
        errors.append(exc)


def link(
    http: aiohttp.ClientSession, config: UpstreamConfig, got: list[Any], **kw: Any
) -> UpstreamLink:
    return UpstreamLink(
        config=config,
        http=http,
        device_mac="aa:bb:cc:dd:ee:01",
        client_id="aa_bb_cc_dd_ee_01",
        on_json=got.append,
        on_audio=got.append,
        **kw,
    )


@pytest.mark.parametrize("framing", list(Framing))
async def test_framing_and_relays(framing: Framing) -> None:
    async with xiaozhi_server(token="t") as peer, aiohttp.ClientSession() as http:
        got = Got()
        config = UpstreamConfig(url=peer.url, token="t", framing=framing)
        up = link(http, config, got)
        up.send_json({"type": "listen", "state": "start", "mode": "auto"})
        for opus in OPUS:
            up.send_audio(opus)  # queued before the hello: flushed after it
        async with asyncio.TaskGroup() as tg:
            tg.create_task(up.run())
            session = await peer.session(0)
            await peer.wait_for(lambda: len(session.audio) == len(OPUS), "audio")
            assert session.audio == OPUS
            assert session.messages == [
                {
                    "type": "listen",
                    "state": "start",
                    "mode": "auto",
                    "session_id": session.session_id,
                }
            ]
            assert session.headers["protocol-version"] == str(framing.protocol_version)
            assert (session.query.get("from") == "mqtt_gateway") == (framing is Framing.GATEWAY)
            assert up.session_id == session.session_id
            if framing is Framing.GATEWAY:
                await session.speak(OPUS[:2], heard="hi")
                await got.until(7)
                assert next(g for g in got if isinstance(g, AudioFrame)).opus == OPUS[0]
                assert got[0] == {"type": "stt", "text": "hi", "session_id": session.session_id}
            up.close()
        assert session.bad_frames == 0


async def test_refused_and_unreachable() -> None:
    async with xiaozhi_server(token="right") as peer, aiohttp.ClientSession() as http:
        with pytest.raises(UpstreamError) as refused:
            await link(http, UpstreamConfig(url=peer.url, token="wrong"), []).run()
        assert refused.value.reason == "handshake_refused"
        assert peer.refused == 1
        url = peer.url
    async with aiohttp.ClientSession() as http:
        with pytest.raises(UpstreamError) as down:
            await link(http, UpstreamConfig(url=url), []).run()
        assert down.value.reason == "connect_failed"


async def test_server_going_away_is_an_error_its_goodbye_is_not() -> None:
    async with aiohttp.ClientSession() as http:
        async with xiaozhi_server() as peer:
            up = link(http, UpstreamConfig(url=peer.url), [])
            async with asyncio.TaskGroup() as tg:
                run = tg.create_task(up.run())
                session = await peer.session(0)
                await session.send_json(type="goodbye")
                await run  # a normal end
        async with xiaozhi_server() as peer:
            up = link(http, UpstreamConfig(url=peer.url), [])
            errors: list[UpstreamError] = []
            async with asyncio.TaskGroup() as tg:
                tg.create_task(outcome(up, errors))
                await peer.session(0)
                await peer.stop()
            assert [e.reason for e in errors] == ["closed"]


async def test_control_overflow_fails_the_link_audio_overflow_drops_oldest() -> None:
    async with xiaozhi_server() as peer, aiohttp.ClientSession() as http:
        drops: list[str] = []
        config = UpstreamConfig(url=peer.url, audio_capacity=2, control_capacity=1)
        up = link(http, config, [], count_drop=drops.append)
        for opus in OPUS[:3]:
            up.send_audio(opus)
        assert drops == ["uplink_overflow"]
        up.send_json({"type": "abort"})
        up.send_json({"type": "abort"})  # one too many: control is never dropped silently
        with pytest.raises(UpstreamError) as failed:
            await up.run()
        assert failed.value.reason == "control_overflow"


def test_backoff_doubles_to_the_cap_and_resets() -> None:
    b = Backoff(1.0, 5.0)
    assert b.allowed(0.0)
    assert [b.failed(10.0) for _ in range(4)] == [1.0, 2.0, 4.0, 5.0]
    assert not b.allowed(14.9)
    assert b.allowed(15.0)
    b.succeeded()
    assert b.allowed(0.0)
    assert b.failed(0.0) == 1.0
