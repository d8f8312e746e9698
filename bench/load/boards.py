"""Board worker process: many simulated boards, each a real MQTT connection, running lessons.

``python -m bench.load.boards SPEC.json`` (started by the harness, one per share of the boards).
It connects its boards (:class:`gateway.simulators.board.BoardSimulator`, the project's board
simulator, reused as a library, on the project's lean MQTT client; TCP_NODELAY on their
sockets, as asyncio sets and board firmware should),
prints ``{"ready": n}``, waits for ``go T0`` on stdin, then a backend client starts each board's
lesson at ``T0 + offset`` (``snlpgw/v1/ctl/{dev}``). Every board notes, on its own clock, when
it published each ``audio.completed`` and when each command reached it; the figure is

    error = next PLAY_MEDIA received - (audio.completed published + listen window T)

with ``T`` from the SPEC formula and the duration the board reported: 0 would be a perfect
gateway and broker; it holds both hops (board → gateway, gateway → board) and timer lateness.
The last window of a lesson is closed by LISTEN_STOP alone (no next clip). The same error is
also cut at the gateway's own stamp in each PLAY_MEDIA (:func:`stamped`): the gateway's part
and the delivery part, with this worker's loop lag at each receipt (:func:`worker_lag_at`), so
a late board worker is told apart from a late gateway. The worker prints one JSON document and
exits when every lesson has ended or its deadline passed.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from bench.load.procs import die_with_parent, hold_gc
from bench.load.speaking import SpokenAnswerReader
from gateway.mqtt import codec
from gateway.mqtt.client import Client
from gateway.mqtt.options import ClientOptions
from gateway.simulators import board as sim_board
from gateway.simulators.board import BoardSimulator, SimOptions
from gateway.tasks.core.rules import listen_window_ms
from topics.errors import WireError
from topics.snlp import parse_command
from topics.snlp_commands import CommandParams, PlayMedia, Sound

CONNECT_TIMEOUT_S = 120.0
START_WINDOW = 20  # start requests awaiting their PUBACK at once


# Commands a lesson sends every step, handled here at less CPU than the simulator (which
# validates each command with pydantic and parses its JSON three times: ~60 µs of a busy core a
# command, seven commands a step, 500 boards a worker): a lesson repeats a few distinct params,
# so each distinct (command, params) is validated by the contract once (the whole command:
# :func:`topics.snlp.parse_command`) and its params model reused; the envelope's other fields
# are checked here. Anything else, or anything the contract refuses, takes the simulator's own
# path (which refuses what is bad).
_LEAN = frozenset({"PLAY_MEDIA", "LISTEN_START", "LISTEN_STOP", "SOUND", "INDICATE"})
_ENVELOPE = frozenset({"v", "id", "ts", "cmd", "params", "prio", "ttl_ms"})
_PLAIN = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # ids JSON writes as they are between quotes
_PARAMS_KNOWN = 256  # distinct (command, params) validated and kept, at most
_params_seen: dict[tuple[str, tuple[tuple[str, Any], ...]], CommandParams] = {}


def _lean_params(body: dict[str, Any], payload: bytes) -> CommandParams | None:
    """A routine command's validated params, or None (the simulator's path then)."""
    cmd, params, ident = body.get("cmd"), body.get("params"), body.get("id")
    if (
        cmd not in _LEAN
        or not isinstance(params, dict)
        or body.keys() - _ENVELOPE
        or body.get("v") != 1
        or not (isinstance(ident, str) and _PLAIN.fullmatch(ident))
        or type(body.get("ts")) is not int
        or type(body.get("prio")) is not int
        or type(body.get("ttl_ms")) is not int
    ):
        return None
    try:
        key = (cmd, tuple(sorted(params.items())))
        known = _params_seen.get(key)
    except TypeError:  # a list or object among the params: not a routine one
        return None
    if known is None:
        try:
            known = parse_command(payload).params
        except WireError:
            return None
        if len(_params_seen) < _PARAMS_KNOWN:
            _params_seen[key] = known
    return known


class LoadBoard(BoardSimulator):
    """Board simulator that timestamps what the latency figure needs (monotonic clock, ms), and
    does a lesson's routine commands at less CPU than the simulator: the same acks and events
    on the wire, written in the same loop turn as the command's PUBACK (one ``send``, not two:
    the simulator hands them to a publisher task that writes them a turn later)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.completed: list[tuple[float, int]] = []  # (published at, duration_ms), clip ends
        self.completed_wall: list[float] = []  # the same instants on the wall clock (ms)
        self.plays: list[float] = []  # first receipt of each PLAY_MEDIA id (not resends)
        # Per play: (received, wall clock ms; the gateway's stamp "ts", wall ms, when it built
        # the command: None if absent)
        self.play_stamps: list[tuple[float, int | None]] = []
        self.stops: list[float] = []  # first receipt of each LISTEN_STOP id
        self.listens: list[float] = []  # first receipt of each LISTEN_START id
        # everything, for a look at a stuck board: (at, direction, command or event, ref)
        self.timeline: list[tuple[float, str, object, object]] = []
        self._firsts: set[str] = set()
        self.done = asyncio.Event()
        self.clips = 0
        self.speaker: SpokenAnswerReader | None = (
            None  # set: the board answers each window with speech
        )
        self._backlog: collections.deque[tuple[str, bytes, int]] = collections.deque()
        self._flying = 0  # publishes awaiting their PUBACK
        self._pub: Client | None = None
        self._ack_topic = f"snlp/v1/{self.dev}/ack"

    def _on_command(self, payload: bytes) -> None:
        now = time.monotonic() * 1000
        body = json.loads(payload)
        cmd, ref = body.get("cmd"), str(body.get("id"))
        self.timeline.append((now, "<", cmd, ref))
        first = ref not in self._firsts
        self._firsts.add(ref)
        if first and cmd == "PLAY_MEDIA":
            self.plays.append(now)
            ts = body.get("ts")
            self.play_stamps.append((time.time() * 1000, ts if isinstance(ts, int) else None))
        elif first and cmd == "LISTEN_START":
            self.listens.append(now)
            if self.speaker is not None:
                self.speaker.listen_started(self.dev, len(self.listens) - 1)
        elif first and cmd == "LISTEN_STOP":
            self.stops.append(now)
            if len(self.stops) >= self.clips:
                self.done.set()
        if not self._lean(cmd, ref, body, payload):
            super()._on_command(payload)

    def _lean(self, cmd: object, ref: str, body: dict[str, Any], payload: bytes) -> bool:
        """The simulator's handling of a routine command (dedup, ack, play / sound event);
        False when it is not one (the caller hands it to the simulator)."""
        params = _lean_params(body, payload)
        if params is None:
            return False
        assert isinstance(cmd, str)  # one of _LEAN
        if ref in self._seen:
            self._ack(ref, cmd, "duplicate")
            return True
        self._seen[ref] = cmd
        while len(self._seen) > 32:  # the simulator's _DEDUP
            self._seen.popitem(last=False)
        if cmd in self.options.unsupported:
            self._ack(ref, cmd, "rejected", "UNSUPPORTED")
            return True
        self.executed[ref] += 1
        self._ack(ref, cmd, "accepted")
        if isinstance(params, PlayMedia):
            self._play(ref, params)
        elif isinstance(params, Sound):
            self._event("sound.completed", ref, {"type": params.type})
        return True  # LISTEN_START / LISTEN_STOP / INDICATE: acked, nothing to run

    def _ack(self, ref: str, cmd: str, status: str, code: str | None = None) -> None:
        """The simulator's ack, its JSON written from a template (the same bytes as its
        ``json.dumps`` of the envelope: tests/unit/test_load_boards.py) when nothing in it
        needs escaping; else, or with faults set, the simulator's own."""
        if code is not None or self._acks_to_drop or not _PLAIN.fullmatch(ref + cmd + status):
            super()._ack(ref, cmd, status, code)
            return
        self.stats[f"ack_{status}"] += 1
        self.timeline.append((time.monotonic() * 1000, ">", cmd, ref))
        payload = (
            f'{{"v": 1, "id": "a{next(self._ids)}", "ts": {sim_board._ms()}, "ref": "{ref}", '
            f'"cmd": "{cmd}", "status": "{status}", "code": null}}'
        )
        self._put(self._ack_topic, payload.encode(), 1)

    def _send(self, kind: str, body: dict[str, Any], *, qos: int = 1) -> None:
        # Noted as the board hands it to its MQTT client, which writes it in this loop turn
        # unless 16 are awaiting their PUBACK: no JSON parsed back per publish.
        now = time.monotonic() * 1000
        self.timeline.append(
            (now, ">", body.get("evt") or body.get("cmd") or kind, body.get("ref"))
        )
        data: dict[str, Any] = body.get("data") or {}
        if body.get("evt") == "audio.completed" and data.get("reason") == "eof":
            self.completed.append((now, int(data["duration_ms"])))
            self.completed_wall.append(time.time() * 1000)
        super()._send(kind, body, qos=qos)

    # Publishing: straight to the client in the caller's turn, in order, at most 16 awaiting
    # their PUBACK (the simulator's window), the rest queued (bounded as the simulator's).

    def _put(self, topic: str, payload: bytes, qos: int) -> None:
        if len(self._backlog) >= 1024:
            self.stats["out_dropped"] += 1
            return
        self._backlog.append((topic, payload, qos))
        self._drain()

    def _drain(self) -> None:
        client = self._pub
        while self._backlog and client is not None and self._flying < 16:
            topic, payload, qos = self._backlog.popleft()
            self._flying += 1
            client.publish(topic, payload, qos=qos, on_done=self._landed)

    def _landed(self) -> None:
        self._flying = max(0, self._flying - 1)
        self._drain()

    async def _publisher(self, client: Client) -> None:
        self._pub, self._flying = client, 0
        try:
            self._drain()
            await asyncio.get_running_loop().create_future()  # until the session ends
        finally:
            self._pub = None


def errors(
    board: LoadBoard, ratio: float, min_window_ms: int
) -> tuple[list[tuple[int, float, float, float | None]], list[float]]:
    """(completed → next PLAY_MEDIA errors with the clip's index, the window's due time and its
    opening delay; last completed → LISTEN_STOP errors), ms: for each clip that played to its
    end, the first new PLAY_MEDIA received after its completed was published, else (the
    lesson's last window) the first new LISTEN_STOP. The opening delay is completed published →
    LISTEN_START received (None when none came between it and the play)."""
    to_play, to_stop = [], []
    for index, (at, duration) in enumerate(board.completed):
        due = at + listen_window_ms(duration, ratio, min_window_ms)
        play = _first_after(board.plays, at)
        if play is not None:
            listen = _first_after(board.listens, at)
            opened = None if listen is None or listen > play else listen - at
            to_play.append((index, due, play - due, opened))
            continue
        stop = _first_after(board.stops, at)
        if stop is not None:
            to_stop.append(stop - due)
    return to_play, to_stop


def stamped(board: LoadBoard, ratio: float, min_window_ms: int) -> tuple[list[float], list[float]]:
    """The next-clip error split at the gateway's own stamp (the PLAY_MEDIA's ``ts``: the
    gateway's wall clock, whole ms, when it built the command), per clip measured by
    :func:`errors`, ms: (stamp - (completed + T): how late the *gateway* was, with the inbound
    hop; received - stamp: the gateway's publish, the broker, and this worker's loop, which
    notes the receipt: the *board worker's* lateness is in this part only). Their sum is the
    error, to within the stamp's millisecond and the two clocks' reads."""
    late, delivery = [], []
    for index, (at, duration) in enumerate(board.completed):
        i = bisect.bisect_right(board.plays, at)
        if i >= len(board.plays):
            continue
        received, ts = board.play_stamps[i]
        if ts is None:
            continue
        due = board.completed_wall[index] + listen_window_ms(duration, ratio, min_window_ms)
        late.append(ts - due)
        delivery.append(received - ts)
    return late, delivery


def worker_lag_at(receipts: list[list[float]], lags: list[tuple[float, float]]) -> list[float]:
    """Per measured receipt (each board's PLAY_MEDIA receipts, monotonic ms): this worker's loop
    lag sample that covers it (the first to wake at or after it: how late the loop was in the
    50 ms around the receipt, which a loop busy when the command came delays by about as much;
    0 when no sample came after it)."""
    woke = [at for at, _ in lags]
    out = []
    for times in receipts:
        for at in times:
            i = bisect.bisect_left(woke, at)
            out.append(lags[i][1] if i < len(lags) else 0.0)
    return out


def _first_after(times: list[float], at: float) -> float | None:
    """The first of ``times`` (ascending: appended as received) later than ``at``."""
    i = bisect.bisect_right(times, at)
    return times[i] if i < len(times) else None


async def lag_monitor(samples: list[tuple[float, float]], period_s: float = 0.05) -> None:
    """How late this worker's own loop wakes up (its share of any board-side delay): (woke at,
    lag), monotonic ms; a board's receipt times wait for the same loop."""
    while True:
        t0 = time.monotonic()
        await asyncio.sleep(period_s)
        now = time.monotonic()
        samples.append((now * 1000, (now - t0 - period_s) * 1000))


async def start_lessons(
    spec: dict[str, Any],
    t0: float,
    refused: list[str],
    asked: dict[str, float],
    assessed: list[tuple[str, int, float]],
) -> None:
    """The backend: one start request per board at its offset, on the project's lean client
    (paho + aiomqtt here cost the board worker's loop milliseconds during the start burst)."""
    lesson = spec["lesson"]
    mine = set(spec["devices"])

    def reply(message: codec.PublishPacket) -> None:
        dev = message.topic.rsplit("/", 1)[1]
        if message.topic.startswith("snlpgw/v1/assessment/"):
            if dev in mine:  # (device, step, received at): close → assessment at the backend
                step = json.loads(message.payload)["step_index"]
                assessed.append((dev, int(step), time.monotonic() * 1000))
            return
        if dev in mine and json.loads(message.payload).get("status") != "accepted":
            refused.append(dev)

    username, password = spec["backend"]
    options = ClientOptions(client_id=f"load-backend-{spec['worker']}", username=username,
                            password=password, version=codec.V311)  # fmt: skip
    client = Client(options, reply)
    await client.connect(spec["host"], spec["port"], wait_s=30)
    await client.subscribe([("snlpgw/v1/reply/+", 1)])
    if "speech" in spec:
        await client.subscribe([("snlpgw/v1/assessment/+", 1)])
    window = asyncio.Semaphore(START_WINDOW)
    for i, (dev, offset) in enumerate(zip(spec["devices"], spec["offsets_s"], strict=True)):
        delay = t0 + offset - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        req = {"v": 1, "id": f"start-{spec['worker']}-{i}", "action": "start",
               "app_id": lesson["app"], "task_id": lesson["task"],
               "lesson_id": lesson["lesson"], "source": "load"}  # fmt: skip
        await window.acquire()
        topic = f"snlpgw/v1/ctl/{dev}"
        asked[dev] = time.monotonic() * 1000  # → its first PLAY_MEDIA: the admission's wait
        client.publish(topic, json.dumps(req).encode(), qos=1, on_done=window.release)
    await asyncio.sleep(spec["deadline_s"])


async def run(spec: dict[str, Any], loop_name: str) -> None:
    lesson = spec["lesson"]
    durations = dict.fromkeys(lesson["paths"], lesson["clip_ms"])
    boards = []
    for dev, password in spec["devices"].items():
        board = LoadBoard(dev, host=spec["host"], port=spec["port"], username=dev,
                          password=password, options=SimOptions(durations=durations))  # fmt: skip
        board.clips = len(lesson["paths"])
        boards.append(board)
    lags: list[tuple[float, float]] = []
    refused: list[str] = []
    asked: dict[str, float] = {}  # device → when its start request was published
    assessed: list[tuple[str, int, float]] = []
    speaker = SpokenAnswerReader(spec) if "speech" in spec else None
    async with asyncio.TaskGroup() as tg:
        for b in boards:
            b.speaker = speaker
            tg.create_task(b.run(), name=f"load.board[{b.dev}]")
        tg.create_task(lag_monitor(lags), name="load.lag")
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            for board in boards:
                await board.connected.wait()
        if speaker is not None:
            await speaker.open()
            tg.create_task(speaker.run(), name="load.speaker")
        sys.stdout.write(json.dumps({"ready": len(boards)}) + "\n")
        sys.stdout.flush()
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        hold_gc()  # from here on it measures
        t0 = float(line.split()[1])
        cpu0 = time.process_time()
        lags.clear()
        tg.create_task(start_lessons(spec, t0, refused, asked, assessed), name="load.starter")
        try:
            async with asyncio.timeout(spec["deadline_s"]):
                for board in boards:
                    await board.done.wait()
        except TimeoutError:
            pass
        lessons_done = time.monotonic()
        if speaker is not None:  # the queue drains after the lessons: until quiet, bounded
            await drained(assessed, spec["speech"]["quiet_s"], spec["speech"]["drain_s"])
        # Report, then exit without tearing down hundreds of clients (the harness needs the
        # figures, not clean goodbyes; the broker closes the sockets).
        result = report(boards, lesson, refused, lags, asked)
        result["cpu_s"] = time.process_time() - cpu0
        result["loop"] = loop_name
        if speaker is not None:
            result["speech"] = speaker.report()
            result["speech"]["drain_s"] = time.monotonic() - lessons_done
            result["speech"].update(assessment_latency(boards, lesson, assessed, speaker.ends))
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
        os._exit(0)


async def drained(assessed: list[tuple[str, int, float]], quiet_s: float, limit_s: float) -> None:
    """Until no assessment came for ``quiet_s`` (the queue is empty), at most ``limit_s``."""
    end = time.monotonic() + limit_s
    seen = -1
    while len(assessed) != seen and time.monotonic() < end:
        seen = len(assessed)
        await asyncio.sleep(quiet_s)


def assessment_latency(
    boards: list[LoadBoard],
    lesson: dict[str, Any],
    assessed: list[tuple[str, int, float]],
    ends: dict[tuple[str, int], float],
) -> dict[str, Any]:
    """Per assessment received by the backend client (ms, the boards' clock): from the end of
    the answer's speech (the utterance's close: the gateway's VAD adds its 300 ms of silence
    to it) and from the window's close (the board's completed + T, as for the next-clip
    figure; negative when the assessment came before the window closed)."""
    by_dev = {b.dev: b for b in boards}
    from_end: list[float] = []
    from_window: list[float] = []
    at_ms: list[float] = []
    unmatched = 0
    for dev, step, received in assessed:
        board, end = by_dev[dev], ends.get((dev, step))
        if step >= len(board.completed) or end is None:
            unmatched += 1
            continue
        at, duration = board.completed[step]
        due = at + listen_window_ms(duration, lesson["ratio"], lesson["min_window_ms"])
        from_end.append(received - end)
        from_window.append(received - due)
        at_ms.append(received)
    return {
        "assessments_received": len(assessed),
        "assessments_unmatched": unmatched,
        "close_to_assessment_ms": from_end,
        "window_close_to_assessment_ms": from_window,
        "assessment_received_at_ms": at_ms,
    }


def report(
    boards: list[LoadBoard],
    lesson: dict[str, Any],
    refused: list[str],
    lags: list[tuple[float, float]],
    asked: dict[str, float],
) -> dict[str, Any]:
    to_play: list[tuple[int, float, float, float | None]] = []
    to_stop: list[float] = []
    gateway_late: list[float] = []
    delivery: list[float] = []
    for board in boards:
        p, s = errors(board, lesson["ratio"], lesson["min_window_ms"])
        to_play += p
        to_stop += s
        late, hop = stamped(board, lesson["ratio"], lesson["min_window_ms"])
        gateway_late += late
        delivery += hop
    unfinished = {
        b.dev: {
            "plays": len(b.plays),
            "completed": len(b.completed),
            "stops": len(b.stops),
            "connected": b.connected.is_set(),
            "timeline": _timeline(b),
        }
        for b in boards
        if not b.done.is_set()
    }
    return {
        "boards": len(boards),
        "lessons_completed": sum(b.done.is_set() for b in boards),
        "plays": sum(len(b.plays) for b in boards),
        "refused": refused,
        "unfinished": dict(list(unfinished.items())[:3]),
        "timeline_first_board": _timeline(boards[0]),
        "completed_to_play_error_ms": [e for _, _, e, _ in to_play],
        "completed_to_play_clip": [i for i, _, _, _ in to_play],
        "completed_to_play_due_ms": [due for _, due, _, _ in to_play],
        "completed_to_play_stamped_ms": gateway_late,
        "play_stamped_to_received_ms": delivery,
        "play_worker_lag_ms": worker_lag_at([b.plays for b in boards], lags),
        "completed_to_listen_ms": [o for _, _, _, o in to_play if o is not None],
        "listen_start_missing": sum(o is None for _, _, _, o in to_play),
        "completed_to_stop_error_ms": to_stop,
        "loop_lag_ms": [lag for _, lag in lags],
        "loop_lag_at_ms": [at for at, _ in lags],
        "start_to_first_play_ms": [
            b.plays[0] - asked[b.dev] for b in boards if b.plays and b.dev in asked
        ],
    }


def _timeline(board: LoadBoard) -> list[str]:
    first = board.timeline[0][0] if board.timeline else 0.0
    return [f"{t - first:.0f} {way} {what} {ref}" for t, way, what, ref in board.timeline]


def main() -> int:
    die_with_parent()
    spec = json.loads(Path(sys.argv[1]).read_text())
    spec["devices"] = dict(spec["devices"])
    # The harness's own loop cost is not under test: libuv's loop where installed (the bench
    # extra), asyncio's otherwise; the results name it (board_loop).
    try:
        import uvloop  # noqa: PLC0415 - optional
    except ImportError:
        asyncio.run(run(spec, "asyncio"))  # exits the process itself once it has reported
    else:
        uvloop.run(run(spec, "uvloop"))
    return 1


if __name__ == "__main__":
    sys.exit(main())
