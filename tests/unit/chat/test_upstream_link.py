"""The upstream link against the xiaozhi server peer (real WebSockets on loopback): headers,
hello, framing versions, relays, failures and the retry back-off."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from gateway.chat.auth import hmac_token
from gateway.chat.bridge import Backoff
from gateway.chat.credentials import UpstreamIdentity
from gateway.chat.framing import AudioFrame, Framing
from gateway.chat.upstream import (
    DeviceHelloInfo,
    ServerHelloInfo,
    UpstreamConfig,
    UpstreamError,
    UpstreamLink,
)
from tests.support.xiaozhi_server import ServerAuth, xiaozhi_server

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


MAC = "aa:bb:cc:dd:ee:01"
UUID = "6f1c2b9e-8d44-4c1a-9d0e-2b7f0c3a5e11"
HELLO = DeviceHelloInfo(
    features={"mcp": True, "glyph_push": False},
    audio_params={"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60},
)


def link(
    http: aiohttp.ClientSession,
    config: UpstreamConfig,
    got: list[Any],
    *,
    token: str | None = None,
    authorization: str | None = None,
    client_id: str | None = UUID,
    **kw: Any,
) -> UpstreamLink:
    header = authorization or (f"Bearer {token}" if token else None)

    async def identify() -> UpstreamIdentity:
        return UpstreamIdentity(MAC, client_id, header)

    return UpstreamLink(
        config=config,
        http=http,
        identify=identify,
        hello=HELLO,
        on_json=got.append,
        on_audio=got.append,
        **kw,
    )


@pytest.mark.parametrize("framing", list(Framing))
async def test_framing_and_relays(framing: Framing) -> None:
    async with xiaozhi_server(token="t") as peer, aiohttp.ClientSession() as http:
        got = Got()
        config = UpstreamConfig(url=peer.url, framing=framing)
        up = link(http, config, got, token="t")
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
                await got.until(8)
                assert next(g for g in got if isinstance(g, AudioFrame)).opus == OPUS[0]
                assert got[0]["payload"]["method"] == "initialize"  # features.mcp: the server asks
                assert got[1] == {"type": "stt", "text": "hi", "session_id": session.session_id}
            up.close()
        assert session.bad_frames == 0


async def test_refused_and_unreachable() -> None:
    async with xiaozhi_server(token="right") as peer, aiohttp.ClientSession() as http:
        with pytest.raises(UpstreamError) as refused:
            await link(http, UpstreamConfig(url=peer.url), [], token="wrong").run()
        assert refused.value.reason == "auth_refused"  # HTTP 401 before the upgrade
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


async def test_headers_and_hello_are_the_devices_own_and_the_servers_hello_is_returned() -> None:
    announced = {"format": "opus", "sample_rate": 24000, "channels": 1, "frame_duration": 60}
    async with (
        xiaozhi_server(echo_client_audio=False, audio=announced) as peer,
        aiohttp.ClientSession() as http,
    ):
        ready = Got()
        up = link(http, UpstreamConfig(url=peer.url), [], on_ready=ready.append)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(up.run())
            session = await peer.session(0)
            await ready.until(1)
            assert session.headers["device-id"] == MAC  # the firmware's Device-Id: its MAC
            assert session.headers["client-id"] == UUID  # its Client-Id: the board's UUID
            assert "authorization" not in session.headers
            assert session.hello is not None
            assert session.hello["features"] == HELLO.features  # the device's own
            assert session.hello["audio_params"] == HELLO.audio_params
            assert ready == [ServerHelloInfo(session.session_id, announced)]
            up.close()


async def test_hmac_token_of_v096_accepted_wrong_key_refused_clearly() -> None:
    auth = ServerAuth(auth_key="server-auth-key")
    async with xiaozhi_server(auth=auth) as peer, aiohttp.ClientSession() as http:
        good = hmac_token("server-auth-key", UUID, MAC, int(time.time()))
        up = link(http, UpstreamConfig(url=peer.url), [], authorization=f"Bearer {good}")
        async with asyncio.TaskGroup() as tg:
            tg.create_task(up.run())
            await peer.session(0)
            up.close()
        bad = hmac_token("another-key", UUID, MAC, int(time.time()))
        with pytest.raises(UpstreamError) as refused:
            await link(http, UpstreamConfig(url=peer.url), [], authorization=f"Bearer {bad}").run()
        assert refused.value.reason == "auth_refused"  # the 认证失败 text, then a close
        # signed for another UUID (what a gateway sending the device id as Client-Id gets)
        other = hmac_token("server-auth-key", "aa_bb_cc_dd_ee_01", MAC, int(time.time()))
        with pytest.raises(UpstreamError) as wrong_id:
            await link(
                http, UpstreamConfig(url=peer.url), [], authorization=f"Bearer {other}"
            ).run()
        assert wrong_id.value.reason == "auth_refused"
        assert peer.auth_refused == 2
        assert len(peer.sessions) == 1


async def test_no_server_hello_within_the_bound() -> None:
    async with xiaozhi_server() as peer, aiohttp.ClientSession() as http:
        peer.answer_hellos.clear()
        with pytest.raises(UpstreamError) as late:
            await link(http, UpstreamConfig(url=peer.url, hello_wait_s=0.3), []).run()
        assert late.value.reason == "hello_timeout"
        peer.answer_hellos.set()
