"""A Sening board simulator: a real MQTT 3.1.1 client speaking snlp/v1, for tests and demos.

It behaves like the board firmware: clean session, optional LWT (retained ``status``), handles
commands one by one in arrival order (the gateway pipelines several; MQTT keeps their order),
acks every command at once, deduplicates command ids (the last 32; a repeat gets ``duplicate`` and
is not executed again), "plays" a clip for its real duration (``durations`` map, else the
clip file under ``media_dir`` measured from its WAV header or ``sox --i -D``, else
``default_duration_ms``), loops ``repeat`` times with one ``audio.completed`` whose
``duration_ms`` is the total, honours STOP/PAUSE/RESUME, preempts on a new PLAY_MEDIA, runs
DOWNLOAD over HTTP with size/sha256 checks, and heartbeats. ``unsupported`` commands (an older
firmware without AUDIO_PAUSE, say) are acked ``rejected`` with code ``UNSUPPORTED``. Faults: drop the first N acks or
events, legacy text events, and ``go_offline()`` (socket dropped without DISCONNECT, so the
broker fires the LWT) / ``come_back()``. It runs in real time: keep clips short in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import subprocess
import time
import uuid
import wave
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from gateway.mqtt import codec
from gateway.mqtt.client import Client
from gateway.mqtt.options import ClientOptions, MqttError
from topics.errors import WireError
from topics.snlp import parse_command
from topics.snlp_commands import Download, PlayMedia, Sound, Wait

log = logging.getLogger(__name__)
_DEDUP = 32
_PUBLISH_WINDOW = 16  # publishes awaiting their PUBACK at once (in order on the wire)


@dataclass(frozen=True)
class SimOptions:
    heartbeat_s: float = 30.0
    lwt: bool = True
    legacy: bool = False
    drop_acks: int = 0
    drop_events: int = 0
    durations: Mapping[str, int] = field(default_factory=dict)
    media_dir: Path | None = None
    default_duration_ms: int = 1000
    sd_dir: Path | None = None
    # Heartbeat figures (SPEC §3 ``hb``): signal, free heap, free SD space, firmware.
    rssi: int = -55
    heap: int = 120_000
    sd_free_mb: float = 1024.0
    fw: str = "sim-1.0"
    download_chunk: int = 64 * 1024  # bytes read (and reported) at a time
    drop_mid_download: int = 0  # the first N DOWNLOADs lose the connection mid-file
    # Commands this board lacks (an older firmware): acked ``rejected`` / UNSUPPORTED.
    unsupported: frozenset[str] = frozenset()


def clip_duration_ms(path: Path) -> int | None:
    """A clip's duration from its WAV header, else from ``sox --i -D``; None if unknown."""
    try:
        with wave.open(str(path), "rb") as w:
            return round(w.getnframes() * 1000 / w.getframerate())
    except (wave.Error, EOFError, OSError):
        pass
    try:
        out = subprocess.run(  # noqa: S603 - fixed argv, no shell
            ["sox", "--i", "-D", str(path)],  # noqa: S607 - sox from PATH (system package)
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return round(float(out.stdout.strip()) * 1000)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


@dataclass
class _Playing:
    ref: str
    name: str
    total_ms: int
    remaining_s: float
    resumed_at: float
    task: asyncio.Task[None] | None = None


class BoardSimulator:
    def __init__(
        self,
        dev: str,
        *,
        host: str,
        port: int,
        username: str,
        password: str | None,
        options: SimOptions | None = None,
    ) -> None:
        self.dev = dev
        self._host, self._port = host, port
        self._username, self._password = username, password
        self.options = options or SimOptions()
        self._acks_to_drop = self.options.drop_acks
        self._events_to_drop = self.options.drop_events
        self._downloads_to_cut = self.options.drop_mid_download
        self._seen: OrderedDict[str, str] = OrderedDict()  # bounded: last _DEDUP ids
        # Bounded; overflow drops the newest message (a simulator under flood) and counts it.
        self._out: asyncio.Queue[tuple[str, bytes, int, bool]] = asyncio.Queue(maxsize=1024)
        self._allowed = asyncio.Event()
        self._allowed.set()
        self.connected = asyncio.Event()
        self._client: Client | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._playing: _Playing | None = None
        self._boot = uuid.uuid4().hex[:8]
        self._started = time.monotonic()
        self._ids = itertools.count(1)
        # What happened, for tests: executions per command id, messages by kind.
        self.executed: Counter[str] = Counter()
        self.received: list[dict[str, Any]] = []
        self.stats: Counter[str] = Counter()
        self.sent_events: list[dict[str, Any]] = []

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self) -> None:
        """Stay connected while allowed; reconnect after a drop. Returns only when cancelled."""
        while True:
            await self._allowed.wait()
            try:
                await self._session()
            except MqttError as exc:
                self.connected.clear()
                log.info("sim %s: connection ended (%s)", self.dev, exc)
                if self._allowed.is_set():
                    await asyncio.sleep(0.2)

    def go_offline(self) -> None:
        """Drop the TCP connection without DISCONNECT (the broker publishes the LWT)."""
        self._allowed.clear()
        self.connected.clear()
        if self._client is not None:
            self._client.abort()

    def come_back(self) -> None:
        self._allowed.set()

    async def _session(self) -> None:
        status = f"snlp/v1/{self.dev}/status"
        will = None
        if self.options.lwt:
            will = codec.Will(status, self._status(online=False), qos=1, retain=True)
        options = ClientOptions(
            client_id=f"sim-{self.dev}-{uuid.uuid4().hex[:6]}",
            keepalive_s=max(5, round(self.options.heartbeat_s * 2)),
            username=self._username,
            password=self._password,
            will=will,
            version=codec.V311,
        )
        client = Client(options, self._on_message)
        await client.connect(self._host, self._port, wait_s=10)
        try:
            async with asyncio.TaskGroup() as tg:
                self._client, self._tg = client, tg
                await client.subscribe([(f"snlp/v1/{self.dev}/cmd", 1)])
                if self.options.lwt:
                    await client.publish_wait(status, self._status(online=True), qos=1, retain=True)
                tg.create_task(self._publisher(client), name=f"sim[{self.dev}].out")
                tg.create_task(self._heartbeats(), name=f"sim[{self.dev}].hb")
                self.connected.set()
                await client.closed()
        except* MqttError as group:
            raise group.exceptions[0] from None
        finally:
            self._client, self._tg = None, None
            self._cancel_playback()
            await client.disconnect(wait_s=1.0)

    def _on_message(self, message: codec.PublishPacket) -> None:
        self._on_command(message.payload)

    async def _publisher(self, client: Client) -> None:
        """PublishPacket in order without waiting for each PUBACK before the next (as esp-mqtt's
        outbox does), at most ``_PUBLISH_WINDOW`` awaiting theirs."""
        window = asyncio.Semaphore(_PUBLISH_WINDOW)
        while True:
            topic, payload, qos, retain = await self._out.get()
            await window.acquire()
            client.publish(topic, payload, qos=qos, retain=retain, on_done=window.release)

    async def _heartbeats(self) -> None:
        while True:
            up_ms = round((time.monotonic() - self._started) * 1000)
            playing = self._playing.ref if self._playing else None
            o = self.options
            hb = {"up_ms": up_ms, "fw": o.fw, "rssi": o.rssi, "heap": o.heap}
            self._send("hb", {**hb, "sd_free_mb": o.sd_free_mb, "playing": {"ref": playing}}, qos=0)
            await asyncio.sleep(self.options.heartbeat_s)

    # -- outbound helpers ------------------------------------------------------------------

    def _status(self, *, online: bool) -> bytes:
        body = {"v": 1, "ts": _ms(), "online": online, "session": self._boot, "by": "board"}
        return json.dumps(body).encode()

    def _send(self, kind: str, body: dict[str, Any], *, qos: int = 1) -> None:
        envelope = {"v": 1, "id": f"{kind[0]}{next(self._ids)}", "ts": _ms(), **body}
        self._put(f"snlp/v1/{self.dev}/{kind}", json.dumps(envelope).encode(), qos)

    def _put(self, topic: str, payload: bytes, qos: int) -> None:
        try:
            self._out.put_nowait((topic, payload, qos, False))
        except asyncio.QueueFull:
            self.stats["out_dropped"] += 1

    def _ack(self, ref: str, cmd: str, status: str, code: str | None = None) -> None:
        if self._acks_to_drop > 0:
            self._acks_to_drop -= 1
            self.stats["acks_dropped"] += 1
            return
        self.stats[f"ack_{status}"] += 1
        self._send("ack", {"ref": ref, "cmd": cmd, "status": status, "code": code})

    def _event(self, evt: str, ref: str | None, data: dict[str, Any]) -> None:
        if self._events_to_drop > 0:
            self._events_to_drop -= 1
            self.stats["events_dropped"] += 1
            return
        self.sent_events.append({"evt": evt, "ref": ref, "data": data})
        verb = evt.removeprefix("audio.")
        if self.options.legacy and evt.startswith("audio."):
            value = data.get("code") if verb == "failed" else data.get("duration_ms")
            text = f"[skill_event]{verb}" + ("" if value is None else f"|{value}")
            self._put(f"snlp/v1/{self.dev}/evt", text.encode(), 1)
            return
        self._send("evt", {"ref": ref, "evt": evt, "data": data})

    # -- commands --------------------------------------------------------------------------

    def _on_command(self, payload: bytes) -> None:
        try:
            command = parse_command(payload)
        except WireError as exc:
            self.stats["bad_commands"] += 1
            log.warning("sim %s: refusing command: %s", self.dev, exc)
            with contextlib.suppress(ValueError, AttributeError):
                raw = json.loads(payload)
                self._ack(str(raw["id"]), str(raw.get("cmd")), "rejected", "BAD_COMMAND")
            return
        self.received.append(json.loads(payload))
        if command.id in self._seen:
            self._ack(command.id, command.cmd, "duplicate")
            return
        self._seen[command.id] = command.cmd
        while len(self._seen) > _DEDUP:
            self._seen.popitem(last=False)
        if command.cmd in self.options.unsupported:
            self._ack(command.id, command.cmd, "rejected", "UNSUPPORTED")
            return
        self.executed[command.id] += 1
        self._ack(command.id, command.cmd, "accepted")
        match command.params:
            case PlayMedia():
                self._play(command.id, command.params)
            case Download():
                self._spawn(self._download(command.id, command.params), "download")
            case Sound():  # a system sound takes no time worth simulating
                self._event("sound.completed", command.id, {"type": command.params.type})
            case Wait():
                self._spawn(self._wait(command.id, command.params.ms), "wait")
            case _:
                self._control(command.id, command.cmd)

    def _control(self, ref: str, cmd: str) -> None:
        p = self._playing
        if cmd == "STOP_MEDIA" and p is not None:
            self._cancel_playback()
            self._event("audio.stopped", p.ref, self._position(p, "stopped"))
        elif cmd == "AUDIO_PAUSE" and p is not None and p.task is not None:
            p.task.cancel()
            p.task = None
            p.remaining_s -= time.monotonic() - p.resumed_at
            self._event("audio.paused", p.ref, {"name": p.name})
        elif cmd == "AUDIO_RESUME" and p is not None and p.task is None:
            p.resumed_at = time.monotonic()
            p.task = self._spawn(self._finish(p), "play")
            self._event("audio.resumed", p.ref, {"name": p.name})
        elif cmd.startswith("TASK_") or cmd == "START_APP_TASK":
            state = "started" if cmd == "START_APP_TASK" else cmd.removeprefix("TASK_").lower()
            self._event("app_task.state", ref, {"state": state})

    def _play(self, ref: str, params: PlayMedia) -> None:
        if self._playing is not None:
            old = self._playing
            self._cancel_playback()
            data = self._position(old, "preempted")
            self._event("audio.completed", old.ref, {**data, "by": ref})
        per_loop = self._duration_ms(params.name) / params.speed
        total = round(per_loop * params.repeat)
        p = _Playing(ref, params.name, total, total / 1000, time.monotonic())
        self._playing = p
        self._event("audio.started", ref, {"name": params.name})
        p.task = self._spawn(self._finish(p), "play")

    async def _finish(self, p: _Playing) -> None:
        await asyncio.sleep(p.remaining_s)
        if self._playing is p:
            self._playing = None
            self._event(
                "audio.completed",
                p.ref,
                {"name": p.name, "duration_ms": p.total_ms, "reason": "eof"},
            )

    async def _wait(self, ref: str, ms: int) -> None:
        await asyncio.sleep(ms / 1000)
        self._event("wait.elapsed", ref, {"ms": ms})

    def _position(self, p: _Playing, reason: str) -> dict[str, Any]:
        played_s = p.total_ms / 1000 - p.remaining_s
        if p.task is not None:
            played_s += time.monotonic() - p.resumed_at
        return {"name": p.name, "duration_ms": max(0, round(played_s * 1000)), "reason": reason}

    def _cancel_playback(self) -> None:
        p, self._playing = self._playing, None
        if p is not None and p.task is not None:
            p.task.cancel()

    def _duration_ms(self, name: str) -> int:
        if name in self.options.durations:
            return self.options.durations[name]
        if self.options.media_dir is not None:
            path = self.options.media_dir / name.lstrip("/")
            if path.is_file():
                measured = clip_duration_ms(path)
                if measured is not None:
                    return measured
        return self.options.default_duration_ms

    def _spawn(self, coro: Any, what: str) -> asyncio.Task[None]:
        if self._tg is None:
            coro.close()
            raise RuntimeError("simulator is not connected")
        task: asyncio.Task[None] = self._tg.create_task(coro, name=f"sim[{self.dev}].{what}")
        return task

    async def _download(self, ref: str, params: Download) -> None:
        """Fetch ``params.url`` over HTTP into ``sd_dir`` (kept in memory without one),
        reporting progress. Bytes go to ``<path>.part`` as they come, so a download cut by a
        dropped connection is resumed by the next DOWNLOAD of the same file with a ``Range``
        request (a 206 appends; a 200 starts over), as a board with an SD card does."""
        sd = self.options.sd_dir
        target = sd / params.path.lstrip("/") if sd is not None else None
        part = target.with_name(target.name + ".part") if target is not None else None
        have = await asyncio.to_thread(_read_part, part) if part is not None else b""
        digest, size = hashlib.sha256(have), len(have)
        headers = {"Range": f"bytes={size}-"} if size else {}
        try:
            async with (
                aiohttp.ClientSession() as http,
                http.get(params.url, headers=headers) as resp,
            ):
                if resp.status == 200 and size:  # the server ignored the range: start over
                    digest, size = hashlib.sha256(), 0
                    if part is not None:
                        await asyncio.to_thread(part.unlink, missing_ok=True)
                elif resp.status not in (200, 206):
                    self._report(ref, ok=False, code=f"HTTP_{resp.status}")
                    return
                self.stats["download_resumed"] += 1 if resp.status == 206 else 0
                async for chunk in resp.content.iter_chunked(self.options.download_chunk):
                    digest.update(chunk)
                    size += len(chunk)
                    if part is not None:
                        await asyncio.to_thread(_append, part, chunk)
                    self._send(
                        "rpt",
                        {
                            "ref": ref,
                            "cmd": "DOWNLOAD",
                            "stage": "progress",
                            "bytes": size,
                            "total": params.size,
                        },
                        qos=0,
                    )
                    self._maybe_drop_mid_download()
        except aiohttp.ClientError as exc:
            self._report(ref, ok=False, code="FETCH_FAILED", detail=str(exc))
            return
        sha = digest.hexdigest()
        if size != params.size or sha != params.sha256:
            if part is not None:
                await asyncio.to_thread(part.unlink, missing_ok=True)
            code = "SIZE_MISMATCH" if size != params.size else "SHA_MISMATCH"
            self._report(ref, ok=False, code=code, bytes=size, sha256=sha)
            return
        if target is not None and part is not None:
            await asyncio.to_thread(part.replace, target)
        self.stats["downloads"] += 1
        self._report(ref, ok=True, bytes=size, sha256=sha)

    def _maybe_drop_mid_download(self) -> None:
        """``drop_mid_download``: the first N downloads lose the connection after their first
        chunk (the broker sends the LWT; the simulator reconnects by itself)."""
        if self._downloads_to_cut > 0 and self._client is not None:
            self._downloads_to_cut -= 1
            self.stats["download_cut"] += 1
            self.connected.clear()
            self._client.abort()

    def _report(self, ref: str, *, ok: bool, **extra: object) -> None:
        extra.pop("detail", None)
        self._send("rpt", {"ref": ref, "cmd": "DOWNLOAD", "stage": "done", "ok": ok, **extra})


def _read_part(part: Path) -> bytes:
    try:
        return part.read_bytes()
    except OSError:
        return b""


def _append(part: Path, chunk: bytes) -> None:
    part.parent.mkdir(parents=True, exist_ok=True)
    with part.open("ab") as f:
        f.write(chunk)


def _ms() -> int:
    return time.time_ns() // 1_000_000


def _parse_durations(items: list[str]) -> dict[str, int]:
    durations: dict[str, int] = {}
    for item in items:
        name, _, ms = item.rpartition("=")
        if not name or not ms.isdigit():
            raise argparse.ArgumentTypeError(f"--duration expects NAME=MS, got {item!r}")
        durations[name] = int(ms)
    return durations


def add_board_simulator_command(subparsers: Any) -> None:
    """``snlpgw simulate board DEVICE_ID …``: ``subparsers`` is the ``simulate`` group's."""
    p = subparsers.add_parser("board", help="simulate a Sening board on snlp/v1")
    p.add_argument("device_id", help="board id (lowercase MAC with underscores)")
    p.add_argument(
        "--url",
        default="mqtt://127.0.0.1:1893",
        help="broker mqtt://host:port (default: the devices' listener of `make run`)",
    )
    p.add_argument("--username", help="broker user (default: the device id)")
    p.add_argument("--password", help="broker password")
    p.add_argument("--heartbeat-s", type=float, default=30.0, help="heartbeat period")
    p.add_argument("--no-lwt", action="store_true", help="no LWT / retained status")
    p.add_argument("--legacy", action="store_true", help="legacy [skill_event] text events")
    p.add_argument("--drop-acks", type=int, default=0, metavar="N", help="drop the first N acks")
    p.add_argument(
        "--drop-events", type=int, default=0, metavar="N", help="drop the first N events"
    )
    p.add_argument("--media-dir", type=Path, help="clip files (durations from WAV/sox)")
    p.add_argument(
        "--duration", action="append", default=[], metavar="NAME=MS", help="clip duration"
    )
    p.add_argument("--default-duration-ms", type=int, default=1000, help="unknown clip duration")
    p.add_argument("--sd-dir", type=Path, help="where DOWNLOAD writes files")
    p.set_defaults(func=_cmd_simulate_board)


def _cmd_simulate_board(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    url = urlsplit(args.url)
    options = SimOptions(
        heartbeat_s=args.heartbeat_s,
        lwt=not args.no_lwt,
        legacy=args.legacy,
        drop_acks=args.drop_acks,
        drop_events=args.drop_events,
        durations=_parse_durations(args.duration),
        media_dir=args.media_dir,
        default_duration_ms=args.default_duration_ms,
        sd_dir=args.sd_dir,
    )
    sim = BoardSimulator(
        args.device_id,
        host=url.hostname or "127.0.0.1",
        port=url.port or 1883,
        username=args.username or args.device_id,
        password=args.password,
        options=options,
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(sim.run())
    return 0
