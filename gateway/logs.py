"""stdlib logging set-up: plain or JSON lines, device/session ids via ``LoggerAdapter``."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import MutableMapping
from typing import Any

_MAX_FIELD = 200  # payloads in log lines are truncated; raw audio and secrets never logged


def truncate(value: object, limit: int = _MAX_FIELD) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes | bytearray) else str(value)
    return text if len(text) <= limit else f"{text[:limit]}…(+{len(text) - limit})"


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in ("device", "session"):
            if hasattr(record, key):
                body[key] = getattr(record, key)
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json.dumps(body, ensure_ascii=False)


class DeviceLog(logging.LoggerAdapter[logging.Logger]):
    """Binds ``device`` (and optionally ``session``) to every line of one device's logs."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        extra = dict(self.extra or {})
        prefix = " ".join(f"{k}={v}" for k, v in extra.items())
        kwargs["extra"] = {**extra, **kwargs.get("extra", {})}
        return f"[{prefix}] {msg}", kwargs


def setup_logging(level: str = "INFO", *, json_lines: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # paho logs every packet at DEBUG; keep it quiet unless asked for.
    logging.getLogger("aiomqtt").setLevel(max(logging.INFO, root.level))
