"""A Xiaozhi device simulator: real HTTP (OTA), real MQTT 3.1.1, real UDP, real Opus.

It behaves like xiaozhi-esp32 firmware v2.4 (reference/xiaozhi-mqtt-udp.md): OTA with the
firmware's headers, the firmware's exact hello JSON, the firmware's hello-reply validation
(``ParseServerHello``), device-side UDP rules (type, exact length, ``seq <= last`` dropped,
downlink audio kept only after ``tts start``), goodbye honoured only with the current
``session_id``. One deliberate difference: it subscribes to its downlink topic (SPEC §3; stock
firmware needs the subscribe patch to work with a standard broker). Its MQTT client is the
gateway's own (:mod:`gateway.mqtt.client`, in 3.1.1 like the firmware): the broker stands
between it and the gateway, and the tests' reference client (paho) checks that client's wire.

The UDP packet code here is written from the reference directly on ``cryptography`` — the header
is built the firmware's way, by overwriting fields of the server's nonce — and shares nothing
with ``codec/``, so tests that pair this simulator with the gateway check interoperability.
Receiving is firmware-exact too (78/xiaozhi-esp32 HEAD 48142026): size, type, exact length and
``seq > last`` are checked, the received 16 header bytes are the counter block, and flags, ssrc
and timestamp are not looked at (the gateway's downlink relies on that: codec/counter_space.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import re
import ssl
import struct
import time
import uuid
import wave
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import opuslib
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from gateway.mqtt import codec
from gateway.mqtt.client import Client
from gateway.mqtt.options import ClientOptions, MqttError

log = logging.getLogger(__name__)

RATE = 16_000
FRAME_MS = 60
FRAME_SAMPLES = RATE * FRAME_MS // 1000
_HEX16 = re.compile(r"[0-9A-Fa-f]{32}")


@dataclass(frozen=True)
class MqttInfo:
    """The OTA answer's ``mqtt`` object, as the firmware stores it."""

    endpoint: str
    client_id: str
    username: str
    password: str
    publish_topic: str
    subscribe_topic: str
    keepalive: int = 240

    @property
    def host(self) -> str:
        return self.endpoint.rsplit(":", 1)[0] if ":" in self.endpoint else self.endpoint

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1]) if ":" in self.endpoint else 8883

    @property
    def tls(self) -> bool:
        return self.port == 8883  # the firmware's rule (reference §2)


@dataclass(frozen=True)
class ServerHelloParams:
    session_id: str
    server: str
    port: int
    key: bytes
    nonce: bytes
    sample_rate: int
    frame_duration: int


def parse_server_hello(obj: Any) -> ServerHelloParams | None:
    """Firmware v2.4 ``ParseServerHello``: ``None`` where the device would ignore the reply."""
    if not isinstance(obj, dict) or obj.get("transport") != "udp":
        return None
    udp = obj.get("udp")
    if not isinstance(udp, dict):
        return None
    server, port, key, nonce = (udp.get(k) for k in ("server", "port", "key", "nonce"))
    if not isinstance(server, str) or isinstance(port, bool) or not isinstance(port, int | float):
        return None
    if not 1 <= port <= 65535:
        return None
    if not all(isinstance(v, str) and _HEX16.fullmatch(v) for v in (key, nonce)):
        return None
    params = obj.get("audio_params")
    params = params if isinstance(params, dict) else {}
    rate, duration = params.get("sample_rate"), params.get("frame_duration")
    sid = obj.get("session_id")
    return ServerHelloParams(
        session_id=sid if isinstance(sid, str) else "",
        server=server,
        port=int(port),
        key=bytes.fromhex(str(key)),
        nonce=bytes.fromhex(str(nonce)),
        sample_rate=int(rate) if isinstance(rate, int | float) else 24_000,
        frame_duration=int(duration) if isinstance(duration, int | float) else 60,
    )


@dataclass
class DeviceUdpCrypto:
    """The device's half of the UDP channel (firmware ``MqttProtocol`` send/receive)."""

    key: bytes
    nonce: bytes
    local_sequence: int = 0
    remote_sequence: int = 0
    drops: dict[str, int] = field(default_factory=dict)

    def _ctr(self, iv: bytes, data: bytes) -> bytes:
        return Cipher(algorithms.AES(self.key), modes.CTR(iv)).encryptor().update(data)

    def seal(self, opus: bytes, timestamp: int = 0) -> bytes:
        self.local_sequence += 1
        iv = bytearray(self.nonce)  # type, flags and ssrc stay as the server sent them
        struct.pack_into(">H", iv, 2, len(opus))
        struct.pack_into(">I", iv, 8, timestamp)
        struct.pack_into(">I", iv, 12, self.local_sequence)
        return bytes(iv) + self._ctr(bytes(iv), opus)

    def open(self, datagram: bytes) -> bytes | None:
        """v2.4 receive rules; ``None`` (counted) for what the firmware drops."""
        if len(datagram) < 16 or datagram[0] != 0x01:
            self._drop("framing")
            return None
        (payload_len,) = struct.unpack_from(">H", datagram, 2)
        if len(datagram) != 16 + payload_len:
            self._drop("length")
            return None
        (seq,) = struct.unpack_from(">I", datagram, 12)
        if seq <= self.remote_sequence:
            self._drop("old_or_duplicate")
            return None
        payload = self._ctr(datagram[:16], datagram[16:])
        self.remote_sequence = seq
        return payload

    def _drop(self, reason: str) -> None:
        self.drops[reason] = self.drops.get(reason, 0) + 1


class _UdpProtocol(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: Callable[[bytes], None]) -> None:
        self._on_datagram = on_datagram

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self._on_datagram(data)


def hello_json(*, aec: bool = False) -> bytes:
    """The firmware's hello, keys in its order (reference §4.1)."""
    features = ('"aec":true,' if aec else "") + '"mcp":true,"glyph_push":false'
    return (
        '{"type":"hello","version":3,"transport":"udp","features":{' + features + "},"
        '"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}'
    ).encode()


SIM_TOOLS = [
    {
        "name": "self.get_device_status",
        "description": "Current volume, battery and network of the device",
        "inputSchema": {"type": "object", "properties": {}},
    }
]


def mcp_reply(request: Any, *, board: str, firmware: str) -> dict[str, Any] | None:
    """The device's MCP server (reference §6.3): numeric ids only, errors without ``code``,
    notifications ignored."""
    if not isinstance(request, dict) or not isinstance(request.get("method"), str):
        return None
    rid = request.get("id")
    method = request["method"]
    if method.startswith("notifications") or isinstance(rid, bool) or not isinstance(rid, int):
        return None
    result: dict[str, Any]
    if method == "initialize":
        result = {
            "protocolVersion": "2024-11-05",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": board, "version": firmware},
        }
    elif method == "tools/list":
        result = {"tools": SIM_TOOLS}
    elif method == "tools/call" and request.get("params", {}).get("name") == SIM_TOOLS[0]["name"]:
        status = {"audio_speaker": {"volume": 70}, "battery": {"level": 88}}
        result = {"content": [{"type": "text", "text": json.dumps(status)}], "isError": False}
    else:
        return {"jsonrpc": "2.0", "id": rid, "error": {"message": f"Unknown method: {method}"}}
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def encode_pcm(pcm: bytes) -> list[bytes]:
    """16 kHz mono s16le → 60 ms Opus packets (application AUDIO like the firmware)."""
    encoder = opuslib.Encoder(RATE, 1, opuslib.APPLICATION_AUDIO)
    size = FRAME_SAMPLES * 2
    padded = pcm + bytes(-len(pcm) % size)
    return [
        encoder.encode(padded[i : i + size], FRAME_SAMPLES) for i in range(0, len(padded), size)
    ]


class ActivationRequired(RuntimeError):
    """The OTA answer carries ``activation`` (code, challenge) instead of ``mqtt``."""

    def __init__(self, activation: dict[str, Any]) -> None:
        super().__init__(f"OTA answer asks for activation (code {activation.get('code')})")
        self.activation = activation


class XiaozhiDeviceSim:
    """One simulated device. Use ``async with`` after :meth:`provision`.

    ``client_id``: the UUID the firmware keeps in NVS (default: a fresh one); ``serial`` and
    ``hmac_key``: an efuse serial number and HMAC key (then ``Activation-Version: 2``)."""

    def __init__(
        self,
        *,
        mac: str,
        board: str = "sim-board",
        firmware: str = "2.4.2",
        client_id: str | None = None,
        serial: str | None = None,
        hmac_key: bytes | None = None,
    ) -> None:
        self.mac = mac.lower()
        self.board = board
        self.firmware = firmware
        self.uuid = client_id or str(uuid.uuid4())
        self.serial = serial
        self.hmac_key = hmac_key
        self.activation: dict[str, Any] | None = None
        self.mqtt_info: MqttInfo | None = None
        self.hello: ServerHelloParams | None = None
        self.crypto: DeviceUdpCrypto | None = None
        self.speaking = False
        self.inbox: list[dict[str, Any]] = []  # every control JSON received, oldest first
        # Its task executor (plan §11): the mode it was told, whether its microphone is the
        # task's now (a listen step), and the step ids it listened in, in order.
        self.mode = "CHAT"
        self.task_listening = False
        self.listened_steps: list[str] = []
        self.ignored_hellos = 0
        self.downlink_audio: list[bytes] = []  # played (queued while speaking) packets
        self.downlink_at: list[float] = []  # time.monotonic() of each, when it was read
        self.downlink_discarded = 0
        self.raw_downlink: list[bytes] | None = None  # set to [] to record every datagram
        self._changed = asyncio.Event()
        self._client: Client | None = None
        self._udp: asyncio.DatagramTransport | None = None
        self._tg: asyncio.TaskGroup | None = None

    def ota_headers(self) -> dict[str, str]:
        headers = {
            "Activation-Version": "2" if self.serial else "1",
            "Device-Id": self.mac,
            "Client-Id": self.uuid,
            "User-Agent": f"{self.board}/{self.firmware}",
            "Accept-Language": "en-US",
            "Content-Type": "application/json",
        }
        if self.serial:
            headers["Serial-Number"] = self.serial
        return headers

    async def provision(self, ota_url: str) -> MqttInfo:
        """The firmware's version check; raises :class:`ActivationRequired` when the answer
        asks for activation (remembered in :attr:`activation` for :meth:`activate`)."""
        body = {"mac_address": self.mac, "application": {"version": self.firmware}}
        async with (
            aiohttp.ClientSession() as http,
            http.post(ota_url, headers=self.ota_headers(), json=body) as resp,
        ):
            payload = await resp.json(content_type=None)
            if resp.status != 200:
                raise RuntimeError(f"OTA refused ({resp.status}): {payload}")
        if "activation" in payload:
            self.activation = payload["activation"]
            raise ActivationRequired(payload["activation"])
        m = payload["mqtt"]
        self.mqtt_info = MqttInfo(
            endpoint=m["endpoint"],
            client_id=m["client_id"],
            username=m["username"],
            password=m["password"],
            publish_topic=m["publish_topic"],
            subscribe_topic=m["subscribe_topic"],
            keepalive=int(m.get("keepalive", 240)),
        )
        return self.mqtt_info

    async def activate(self, ota_url: str, *, signature: str | None = None) -> int:
        """One ``POST <ota>/activate`` as ``Ota::Activate`` sends it; returns the HTTP status
        (200 activated, 202 still waiting). ``signature`` overrides the computed HMAC."""
        challenge = (self.activation or {}).get("challenge", "")
        payload: dict[str, str] = {}
        if self.serial:
            digest = hmac.new(self.hmac_key or b"", challenge.encode(), hashlib.sha256)
            payload = {
                "algorithm": "hmac-sha256",
                "serial_number": self.serial,
                "challenge": challenge,
                "hmac": signature if signature is not None else digest.hexdigest(),
            }
        url = ota_url + ("activate" if ota_url.endswith("/") else "/activate")
        async with (
            aiohttp.ClientSession() as http,
            http.post(url, headers=self.ota_headers(), json=payload) as resp,
        ):
            await resp.read()
            return resp.status

    async def __aenter__(self) -> XiaozhiDeviceSim:
        info = self._info()
        options = ClientOptions(
            client_id=info.client_id,
            keepalive_s=info.keepalive,
            username=info.username,
            password=info.password,
            version=codec.V311,  # the firmware's MQTT, clean session
        )
        client = Client(options, lambda message: self._on_json(message.payload))
        tls = ssl.create_default_context() if info.tls else None
        await client.connect(info.host, info.port, tls=tls, wait_s=10)
        try:
            await client.subscribe([(info.subscribe_topic, 0)])
        except BaseException:
            client.abort()
            raise
        self._client = client
        self._tg = asyncio.TaskGroup()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._close_udp()
        if self._client is not None:
            await self._client.disconnect()
            self._client = None
        if self._tg is not None:
            await self._tg.__aexit__(None, None, None)
            self._tg = None

    # -- device actions ------------------------------------------------------------------------

    async def publish(self, payload: bytes | str, *, topic: str | None = None) -> None:
        """Publish at QoS 0 (as the firmware does) on the device's publish topic, or on
        ``topic`` (a device trying where it should not; the broker's ACL drops it silently)."""
        if self._client is None:
            raise RuntimeError("not connected")
        data = payload.encode() if isinstance(payload, str) else payload
        await self._client.publish_wait(topic or self._info().publish_topic, data, qos=0)

    async def open_audio_channel(self, *, timeout_s: float = 10.0) -> ServerHelloParams:
        """Send hello, wait for a reply the firmware accepts, open the UDP socket."""
        seen = len(self.inbox)
        await self.publish(hello_json())
        reply = await self.expect("hello", timeout_s=timeout_s, after=seen)
        hello = parse_server_hello(reply)
        if hello is None:
            raise RuntimeError(f"firmware would ignore this hello reply: {reply}")
        self._close_udp()
        self.hello = hello
        self.crypto = DeviceUdpCrypto(key=hello.key, nonce=hello.nonce)
        loop = asyncio.get_running_loop()
        self._udp, _ = await loop.create_datagram_endpoint(
            lambda: _UdpProtocol(self._on_datagram), remote_addr=(hello.server, hello.port)
        )
        return hello

    async def send_json(self, **fields: Any) -> None:
        """A device message with ``session_id`` first, like ``protocol.cc``."""
        sid = self.hello.session_id if self.hello else ""
        await self.publish(json.dumps({"session_id": sid, **fields}, separators=(",", ":")))

    async def listen_start(self, mode: str = "auto") -> None:
        await self.send_json(type="listen", state="start", mode=mode)

    async def listen_stop(self) -> None:
        await self.send_json(type="listen", state="stop")

    async def goodbye(self) -> None:
        await self.send_json(type="goodbye")
        self._close_udp()

    def send_datagram(self, datagram: bytes) -> None:
        if self._udp is None:
            raise RuntimeError("audio channel not open")
        self._udp.sendto(datagram)

    async def stream_pcm(self, pcm: bytes, *, speed: float = 1.0) -> int:
        return await self.stream_opus(encode_pcm(pcm), speed=speed)

    async def stream_opus(self, packets: Sequence[bytes], *, speed: float = 1.0) -> int:
        """Send packets as uplink audio, one per 60 ms / ``speed`` (1.0 = real time)."""
        if self.crypto is None:
            raise RuntimeError("audio channel not open")
        if speed <= 0:
            raise ValueError("speed must be positive")
        loop = asyncio.get_running_loop()
        start = loop.time()
        for index, packet in enumerate(packets):
            delay = start + index * FRAME_MS / 1000 / speed - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self.send_datagram(self.crypto.seal(packet))
        return len(packets)

    async def expect(
        self, kind: str, *, timeout_s: float = 10.0, after: int = 0, **match: Any
    ) -> dict[str, Any]:
        """The first control message of type ``kind`` (and ``match`` fields) past ``after``."""
        async with asyncio.timeout(timeout_s):
            while True:
                for msg in self.inbox[after:]:
                    if msg.get("type") == kind and all(msg.get(k) == v for k, v in match.items()):
                        return msg
                self._changed.clear()
                await self._changed.wait()

    async def wait_audio(self, count: int, *, timeout_s: float = 10.0) -> list[bytes]:
        async with asyncio.timeout(timeout_s):
            while len(self.downlink_audio) < count:
                self._changed.clear()
                await self._changed.wait()
        return self.downlink_audio

    # -- internals ---------------------------------------------------------------------------

    def _info(self) -> MqttInfo:
        if self.mqtt_info is None:
            raise RuntimeError("provision() first")
        return self.mqtt_info

    def _on_json(self, payload: bytes) -> None:
        try:
            msg = json.loads(payload)
        except ValueError:
            return
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            return
        self.inbox.append(msg)
        kind = msg["type"]
        if kind == "goodbye":
            # v2.3+: only a goodbye naming the current session closes the channel.
            if self.hello is not None and msg.get("session_id") == self.hello.session_id:
                self._close_udp()
        elif kind == "tts" and msg.get("state") in ("start", "stop"):
            self.speaking = msg["state"] == "start"
        elif kind in ("mode.set", "step.start") or kind.startswith("task."):
            self._task_message(msg)
        elif kind == "mcp" and self._tg is not None:
            reply = mcp_reply(msg.get("payload"), board=self.board, firmware=self.firmware)
            if reply is not None:
                self._tg.create_task(self._mcp_reply(reply), name=f"sim[{self.mac}].mcp")
        self._changed.set()

    def _task_message(self, msg: dict[str, Any]) -> None:
        """Phase-2 firmware: follow the mode, open the microphone for a listen step (until the
        next step or task message), and report the step as started."""
        kind = msg["type"]
        if kind == "mode.set":
            self.mode = str(msg.get("mode"))
        listen = kind == "step.start" and msg.get("action") == "listen" and self.mode != "CHAT"
        self.task_listening = listen
        if listen:
            self.listened_steps.append(str(msg.get("step_id")))
        if kind == "step.start" and self._tg is not None:
            report = {
                "type": "step.started",
                "session_id": msg.get("session_id"),
                "task_instance_id": msg.get("task_instance_id"),
                "step_id": msg.get("step_id"),
            }
            self._tg.create_task(self.send_json(**report), name=f"sim[{self.mac}].task")

    async def _mcp_reply(self, reply: dict[str, Any]) -> None:
        """Answer an MCP request, unless the device disconnected meanwhile (as the firmware's
        reply is lost when its MQTT link is gone)."""
        if self._client is None:
            return
        with contextlib.suppress(MqttError, RuntimeError):  # RuntimeError: not connected
            await self.send_json(type="mcp", payload=reply)

    def _on_datagram(self, datagram: bytes) -> None:
        if self.raw_downlink is not None:
            self.raw_downlink.append(datagram)
        if self.crypto is None:
            return
        opus = self.crypto.open(datagram)
        if opus is None:
            return
        if self.speaking:
            self.downlink_audio.append(opus)
            self.downlink_at.append(time.monotonic())
        else:
            self.downlink_discarded += 1
        self._changed.set()

    def _close_udp(self) -> None:
        if self._udp is not None:
            self._udp.close()
            self._udp = None
        self.speaking = False


def read_wav(path: Path) -> bytes:
    """16 kHz mono 16-bit WAV PCM (convert other files with sox first)."""
    with wave.open(str(path), "rb") as wav:
        if (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) != (RATE, 1, 2):
            raise ValueError(f"{path}: need 16 kHz mono 16-bit PCM WAV")
        return wav.readframes(wav.getnframes())


async def simulate(args: argparse.Namespace) -> dict[str, Any]:
    # Like the firmware's NVS UUID, the simulated board keeps one Client-Id per MAC across runs.
    client_id = args.client_id or str(uuid.uuid5(uuid.NAMESPACE_OID, f"snlpgw-sim/{args.mac}"))
    sim = XiaozhiDeviceSim(mac=args.mac, board=args.board, client_id=client_id)
    try:
        await sim.provision(args.ota_url)
    except ActivationRequired as pending:
        code = pending.activation.get("code")
        log.warning("activation needed: approve with `snlpgw device approve %s`", code)
        for _ in range(200):  # the firmware polls every 3 s (here up to 10 minutes)
            if await sim.activate(args.ota_url) == 200:
                break
            await asyncio.sleep(3)
        await sim.provision(args.ota_url)
    async with sim:
        hello = await sim.open_audio_channel()
        await sim.listen_start(args.mode)
        sent = await sim.stream_pcm(read_wav(args.wav), speed=args.speed)
        await asyncio.sleep(args.linger_s)
        await sim.goodbye()
    return {
        "device": sim.mac,
        "session_id": hello.session_id,
        "udp": f"{hello.server}:{hello.port}",
        "frames_sent": sent,
        "messages_received": [m.get("type") for m in sim.inbox],
        "downlink_packets": len(sim.downlink_audio),
        "udp_drops": sim.crypto.drops if sim.crypto else {},
    }


def add_xiaozhi_simulator_command(subparsers: Any) -> None:
    """Adds ``xiaozhi`` to the ``snlpgw simulate`` sub-commands."""
    p = subparsers.add_parser("xiaozhi", help="simulate a Xiaozhi device (OTA, MQTT, UDP audio)")
    p.add_argument("--ota-url", required=True, help="e.g. http://127.0.0.1:8003/xiaozhi/ota/")
    p.add_argument("--wav", type=Path, required=True, help="16 kHz mono 16-bit WAV to speak")
    p.add_argument("--mac", default="24:0a:c4:5e:00:01", help="device MAC (Device-Id)")
    p.add_argument("--board", default="sim-board", help="board name for User-Agent")
    p.add_argument("--client-id", default=None, help="Client-Id UUID (default: fixed per MAC)")
    p.add_argument("--mode", default="auto", choices=["auto", "manual", "realtime"])
    p.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="pacing: 1 = real time (the gateway's default budget, 40 datagrams/s per device, "
        "drops frames above about 2x)",
    )
    p.add_argument("--linger-s", type=float, default=2.0, help="wait for replies after audio")
    p.set_defaults(func=_run_cli)


def _run_cli(args: argparse.Namespace) -> int:
    result = asyncio.run(simulate(args))
    print(json.dumps(result, indent=2))  # noqa: T201 - the command's output
    return 0
