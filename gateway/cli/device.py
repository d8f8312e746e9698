"""``snlpgw device approve CODE | pending | list | rotate DEV | forget DEV``: the running gateway's device
approval API (admin listener, ``gateway.xiaozhi.ota.admin``) from the command line.

The admin URL and token come from the settings (``http.admin_host``, ``http.admin_port``,
``http.admin_token``, e.g. ``SNLPGW_HTTP__ADMIN_TOKEN``) unless ``--admin-url`` is given.
Answers are printed as JSON; the exit status is 0 on success, 1 when the gateway said no, 2 when
it could not be reached.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any

from gateway.cli.subcommands import Subparsers
from gateway.settings import load_settings

_TIMEOUT_S = 10.0


def add_device_commands(sub: Subparsers) -> None:
    device = sub.add_parser("device", help="approve devices (the gateway's admin API)")
    device.add_argument("--admin-url", default=None, help="default: from the settings")
    actions = device.add_subparsers(dest="device_command", required=True)
    approve = actions.add_parser("approve", help="approve the 6-digit code a device shows")
    approve.add_argument("code")
    approve.set_defaults(func=_approve)
    actions.add_parser("pending", help="activation codes waiting").set_defaults(func=_pending)
    actions.add_parser("list", help="bound devices").set_defaults(func=_list)
    rotate = actions.add_parser("rotate", help="give a bound device its next password")
    rotate.add_argument("dev", help="device id aa_bb_cc_dd_ee_ff")
    rotate.set_defaults(func=_rotate)
    forget = actions.add_parser(
        "forget",
        help="erase a device's learning record (audio, transcripts, metrics) and unbind it",
    )
    forget.add_argument("dev", help="device id aa_bb_cc_dd_ee_ff")
    forget.set_defaults(func=_forget)


def _approve(args: argparse.Namespace) -> int:
    return _call(args, "POST", "/admin/devices/approve", {"code": args.code})


def _pending(args: argparse.Namespace) -> int:
    return _call(args, "GET", "/admin/devices/pending")


def _list(args: argparse.Namespace) -> int:
    return _call(args, "GET", "/admin/devices")


def _rotate(args: argparse.Namespace) -> int:
    return _call(args, "POST", f"/admin/devices/{args.dev}/rotate", {})


def _forget(args: argparse.Namespace) -> int:
    """Erase the device's learning record (audio, transcripts, metrics, store rows: the
    archive's ``DELETE /admin/records/{dev}``), then unbind it. One JSON answer: the unbind's,
    with the erasure's counts under ``record``. A gateway without an archive (404) has
    nothing to erase; a failed erasure fails the command before anything is unbound."""
    base, headers = _target(args)
    status, text = _request(base, headers, "DELETE", f"/admin/records/{args.dev}")
    if status is None:
        sys.stderr.write(f"snlpgw device: cannot reach {base}: {text}\n")
        return 2
    if status not in (200, 404):
        sys.stdout.write(text + "\n")
        sys.stderr.write(
            f"snlpgw device: erasing the learning record failed ({status}); nothing was "
            f"unbound, run it again / 删除学习记录失败 ({status}), 设备未解绑, 请重试\n"
        )
        return 1
    record = json.loads(text) if status == 200 else None
    status, text = _request(base, headers, "DELETE", f"/admin/devices/{args.dev}")
    if status is None:
        sys.stderr.write(f"snlpgw device: cannot reach {base}: {text}\n")
        return 2
    try:
        answer = json.loads(text)
    except ValueError:
        answer = {"detail": text}
    sys.stdout.write(json.dumps({**answer, "record": record}) + "\n")
    if status >= 400:
        sys.stderr.write(f"snlpgw device: the gateway answered {status}\n")
        return 1
    return 0


def _target(args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    settings = load_settings(getattr(args, "config", None))
    http = settings.http
    base = args.admin_url or f"http://{http.admin_host}:{http.admin_port}"
    headers = {"Content-Type": "application/json"}
    if http.admin_token is not None:
        headers["Authorization"] = f"Bearer {http.admin_token.get_secret_value()}"
    return base, headers


def _request(
    base: str, headers: dict[str, str], method: str, path: str, body: Any = None
) -> tuple[int | None, str]:
    """(HTTP status, body text), or (None, why) when the gateway cannot be reached."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, headers=headers, method=method)  # noqa: S310 - operator-given admin URL
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as resp:  # noqa: S310
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return None, str(exc)


def _call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> int:
    base, headers = _target(args)
    status, text = _request(base, headers, method, path, body)
    if status is None:
        sys.stderr.write(f"snlpgw device: cannot reach {base}: {text}\n")
        return 2
    sys.stdout.write(text + "\n")
    if status >= 400:
        sys.stderr.write(f"snlpgw device: the gateway answered {status}\n")
        return 1
    return 0
