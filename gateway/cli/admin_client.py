"""A small client of the running gateway's admin API for ``snlpgw lesson`` and ``snlpgw
catalog reload``: the URL and token come from the settings (``http.admin_host``,
``http.admin_port``, ``http.admin_token``) unless ``--admin-url`` is given."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from gateway.settings import load_settings

TIMEOUT_S = 90.0  # a lesson start may wait for its admission slot (runtime.start_max_wait_s)


@dataclass(frozen=True)
class AdminAnswer:
    """``status`` None: the gateway could not be reached (``problem`` says why)."""

    status: int | None
    body: Any = None
    problem: str = ""


def admin_call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> AdminAnswer:
    settings = load_settings(getattr(args, "config", None))
    http = settings.http
    base = getattr(args, "admin_url", None) or f"http://{http.admin_host}:{http.admin_port}"
    headers = {"Content-Type": "application/json"}
    if http.admin_token is not None:
        headers["Authorization"] = f"Bearer {http.admin_token.get_secret_value()}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, headers=headers, method=method)  # noqa: S310 - operator-given admin URL
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:  # noqa: S310
            return AdminAnswer(resp.status, _json(resp.read()))
    except urllib.error.HTTPError as exc:
        return AdminAnswer(exc.code, _json(exc.read()))
    except OSError as exc:
        return AdminAnswer(None, problem=f"cannot reach {base}: {exc}")


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return {"error": "not_json", "detail": raw[:200].decode(errors="replace")}
