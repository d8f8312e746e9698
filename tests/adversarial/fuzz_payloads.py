"""Hypothesis strategies for the topic fuzz: what an attacker can put on each gateway topic.

Payloads are drawn once, up front (:func:`draw_batch`), so the broker then carries them in
bulk: valid-ish JSON (real messages with fields mutated, dropped, retyped or added), random
JSON documents, garbage bytes, legacy board text, and oversized bodies (over the gateway's
8192-byte inbound cap, under the broker's 65536-byte packet limit).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

# One real message per topic kind (SPEC §3), the seeds the mutations start from.
TEMPLATES: dict[str, list[dict[str, Any]]] = {
    "ack": [{"v": 1, "ref": "c1", "cmd": "PLAY_MEDIA", "status": "accepted"}],
    "rpt": [{"v": 1, "ref": "c3", "cmd": "DOWNLOAD", "stage": "done", "ok": True, "bytes": 9}],
    "evt": [
        {
            "v": 1,
            "evt": "audio.completed",
            "ref": "c1",
            "data": {"name": "01.mp3", "duration_ms": 2140, "reason": "eof"},
        },
        {"v": 1, "evt": "button", "data": {"press": "long"}},
        {"v": 1, "evt": "app_task.state", "data": {"state": "running"}},
    ],
    "hb": [{"v": 1, "up_ms": 1000, "playing": False, "rssi": -60}],
    "status": [{"v": 1, "online": True, "session": "boot-1", "by": "board"}],
    "xiaozhi": [
        {
            "type": "hello",
            "version": 3,
            "transport": "udp",
            "audio_params": {
                "format": "opus",
                "sample_rate": 16000,
                "channels": 1,
                "frame_duration": 60,
            },
        },
        {"type": "listen", "session_id": "s1", "state": "detect", "text": "hi"},
        {"type": "goodbye", "session_id": "s1"},
        {"type": "abort", "session_id": "s1"},
        {"type": "mcp", "session_id": "s1", "payload": {"jsonrpc": "2.0", "id": 1, "result": {}}},
    ],
    "ctl": [
        {
            "v": 1,
            "id": "r1",
            "action": "start",
            "app_id": "english_learning",
            "task_id": "shadowing",
            "lesson_id": "unit01",
            "priority": 3,
        },
        {"v": 1, "id": "r2", "action": "stop"},
        {"v": 1, "id": "r3", "action": "pause"},
    ],
}
LEGACY = ["[skill_event]completed|2140", "[skill_event]completed|", "[skill_event]|", "]["]

_KEYS = ["v", "id", "ref", "cmd", "evt", "stage", "status", "data", "type", "session_id",
         "action", "state", "online", "up_ms", "ok", "name", "duration_ms", "press", ""]  # fmt: skip
# Cheap to draw on purpose: 10,000 of them are drawn per run.
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
_json = (
    _scalars
    | st.lists(_scalars, max_size=3)
    | st.dictionaries(st.sampled_from(_KEYS), _scalars, max_size=3)
)


@st.composite
def _mutated(draw: st.DrawFn, kind: str) -> bytes:
    message = dict(draw(st.sampled_from(TEMPLATES[kind])))
    for _ in range(draw(st.integers(1, 2))):
        key = draw(st.sampled_from([*message, *_KEYS]))
        match draw(st.integers(0, 2)):
            case 0:
                message[key] = draw(_json)
            case 1:
                message.pop(key, None)
            case _:
                message[draw(st.text(max_size=8))] = draw(_json)
    return json.dumps(message).encode()


@st.composite
def _oversized(draw: st.DrawFn, kind: str) -> bytes:
    message = dict(draw(st.sampled_from(TEMPLATES[kind])))
    message["pad"] = "x" * draw(st.integers(8_200, 20_000))
    return json.dumps(message).encode()


def payloads(kind: str) -> st.SearchStrategy[bytes]:
    return st.one_of(
        _mutated(kind),
        _json.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=200),
        st.sampled_from(LEGACY).map(str.encode),
        st.text(max_size=60).map(str.encode),
        _oversized(kind),
    )


def draw_batch(kinds: list[str], count: int, *, per_example: int = 25) -> list[tuple[str, bytes]]:
    """``count`` (kind, payload) pairs drawn by Hypothesis (derandomized: the same every run)."""
    out: list[tuple[str, bytes]] = []
    item = st.sampled_from(kinds).flatmap(lambda k: payloads(k).map(lambda p: (k, p)))

    @settings(
        max_examples=-(-count // per_example),
        phases=[Phase.generate],
        database=None,
        derandomize=True,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(item, min_size=per_example, max_size=per_example))
    def collect(batch: list[tuple[str, bytes]]) -> None:
        out.extend(batch)

    collect()
    return out
