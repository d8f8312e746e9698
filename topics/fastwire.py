"""Hot-path encoders for our own messages: the same bytes as the pydantic models, without a model
round trip per message (at 1,000 lessons, validating and dumping a command or task event through
its model was ~25-35 us each, a tenth of the gateway's CPU per clip step).

* :func:`command_bytes`: a command's params are validated and encoded through the models once per
  distinct (cmd, params) and remembered (a lesson sends the same few params over and over); the
  envelope around them is written by hand after checking its fields as the model would.
* :func:`task_event_bytes`: a task event whose fields are plain (ids, ints, simple strings) is
  written by hand, field order as the models declare it.

Either returns ``None`` when the input is not of the simple kind it handles; the caller then takes
the model path, which refuses what the contract refuses. ``tests/unit/topics/test_fastwire.py``
compares the bytes with the models' output.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from topics.tree import DEVICE_ID_RE

__all__ = ["PARAMS_KEPT", "ParamsCache", "command_bytes", "task_event_bytes"]

PARAMS_KEPT = 4_096  # distinct (cmd, params) remembered; all forgotten when full
_LIFECYCLE = frozenset(
    {
        "instance.started",
        "instance.paused",
        "instance.resumed",
        "instance.completed",
        "instance.restored",
        "step.played",
        "step.failed",
        "speech.started",
        "speech.stopped",
    }
)
# The window events' data models: (field, minimum or None), in declared order; every field an int.
_WINDOW_DATA: dict[str, tuple[tuple[str, int | None], ...]] = {
    "window.opened": (("window_ms", 0), ("planned_close_ms", 0)),
    "window.closed": (
        ("planned_close_ms", 0),
        ("actual_close_ms", 0),
        ("lateness_ms", None),
        ("window_ms", 0),
    ),
}
_ENC = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def _plain(s: object, max_len: int) -> bool:
    """A string both encoders write the same way and the models accept as an id/name."""
    return (
        type(s) is str
        and 0 < len(s) <= max_len
        and s.isascii()
        and s.isprintable()
        and '"' not in s
        and "\\" not in s
    )


def _int(v: object, minimum: int | None) -> bool:
    return type(v) is int and (minimum is None or v >= minimum)


ParamsKey = tuple[object, ...]
ParamsCache = dict[ParamsKey, bytes]


def _params_key(cmd: str, params: Mapping[str, object]) -> ParamsKey | None:
    key: list[object] = [cmd]
    for k, v in params.items():
        if type(v) not in (str, int, bool) or type(k) is not str:
            return None  # floats (-0.0 == 0.0), lists, dicts: the model path
        key += (k, type(v), v)
    return tuple(key)


def command_bytes(
    cache: ParamsCache,
    cmd: str,
    params: Mapping[str, object],
    *,
    id: str,
    ts_ms: int,
    prio: int,
    ttl_ms: int,
    encode_params: Callable[[], bytes],
) -> bytes | None:
    """The command's bytes, or ``None`` (take the model path). ``encode_params`` validates the
    full command through the model and returns its ``params`` JSON (raising what it raises)."""
    if not (_plain(id, 64) and _int(ts_ms, 0) and prio in (1, 2, 3) and type(prio) is int):
        return None
    if not (_int(ttl_ms, 1) and _plain(cmd, 64)):
        return None
    key = _params_key(cmd, params)
    if key is None:
        return None
    body = cache.get(key)
    if body is None:
        body = encode_params()
        if len(cache) >= PARAMS_KEPT:
            cache.clear()
        cache[key] = body
    head = f'{{"v":1,"id":"{id}","ts":{ts_ms},"cmd":"{cmd}","params":'.encode()
    return b'%s%s,"prio":%d,"ttl_ms":%d}' % (head, body, prio, ttl_ms)


def task_event_bytes(
    device: str,
    event: str,
    instance_id: str | None,
    step_index: int | None,
    data: Mapping[str, object],
    *,
    ts_ms: int,
) -> bytes | None:
    """A task event's bytes, or ``None`` (take the model path)."""
    plain_envelope = (
        DEVICE_ID_RE.fullmatch(device) is not None
        and _int(ts_ms, 0)
        and (instance_id is None or _plain(instance_id, 64))
        and (step_index is None or _int(step_index, 0))
    )
    body = _event_data(event, data) if plain_envelope else None
    if body is None:
        return None
    inst = "" if instance_id is None else f',"instance_id":"{instance_id}"'
    step = "" if step_index is None else f',"step_index":{step_index}'
    head = f'{{"v":1,"ts":{ts_ms},"device":"{device}","event":"{event}"{inst}{step}'
    return f'{head},"data":{body}}}'.encode()


def _event_data(event: str, data: Mapping[str, object]) -> str | None:
    fields = _WINDOW_DATA.get(event)
    if fields is not None:
        if len(data) != len(fields) or not all(_int(data.get(k), m) for k, m in fields):
            return None
        return "{" + ",".join(f'"{k}":{data[k]}' for k, _ in fields) + "}"
    if event in _LIFECYCLE and all(
        _plain(k, 256) and (v is None or _simple(v)) for k, v in data.items()
    ):
        return _ENC(dict(data))
    return None


def _simple(v: object) -> bool:
    t = type(v)
    return t is bool or t is int or (t is str and _plain_value(v))  # type: ignore[arg-type]


def _plain_value(s: str) -> bool:
    return s == "" or _plain(s, 1 << 20)
