"""Sub-commands contributed by the gateway's domains (credentials, catalog, simulators)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

Subparsers = Any  # argparse's _SubParsersAction is private; typed loosely on purpose


def _catalog_check(args: argparse.Namespace) -> int:
    from gateway.settings import load_settings  # noqa: PLC0415
    from gateway.tasks.core import catalog_check_main  # noqa: PLC0415 - keeps start-up light

    resource_dir = args.resource_dir or load_settings(args.config).runtime.resource_dir
    return catalog_check_main(args.path, resource_dir)


def _catalog_reload(args: argparse.Namespace) -> int:
    import json  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from gateway.cli.admin_client import admin_call  # noqa: PLC0415

    answer = admin_call(args, "POST", "/admin/catalog/reload", {})
    if answer.status is None:
        sys.stderr.write(f"snlpgw catalog: 无法连接网关 / {answer.problem}\n")
        return 2
    sys.stdout.write(json.dumps(answer.body, ensure_ascii=False) + "\n")
    body = answer.body if isinstance(answer.body, dict) else {}
    if answer.status != 200 or not body.get("ok"):
        sys.stderr.write(
            "snlpgw catalog: 课程目录未更新 / catalog not reloaded (kept the old one)\n"
        )
        return 1
    sys.stderr.write(f"课程目录已更新 / catalog reloaded: version {body.get('version')}\n")
    return 0


def add_catalog_commands(sub: Subparsers) -> None:
    catalog = sub.add_parser("catalog", help="task catalog tools")
    catalog_sub = catalog.add_subparsers(dest="catalog_command", required=True)
    check = catalog_sub.add_parser("check", help="validate a catalog file or directory")
    check.add_argument("path", type=Path)
    check.add_argument("--resource-dir", type=Path, help="local resources (clip .txt transcripts)")
    check.set_defaults(func=_catalog_check)
    reload = catalog_sub.add_parser(
        "reload", help="reload the running gateway's catalog (validated, swapped atomically)"
    )
    reload.add_argument("--admin-url", default=None, help="default: from the settings")
    reload.set_defaults(func=_catalog_reload)


def add_simulator_commands(sub: Subparsers) -> None:
    from gateway.simulators.board import add_board_simulator_command  # noqa: PLC0415
    from gateway.simulators.xiaozhi import add_xiaozhi_simulator_command  # noqa: PLC0415

    simulate = sub.add_parser("simulate", help="device simulators (real MQTT/UDP clients)")
    devices = simulate.add_subparsers(dest="device", required=True)
    add_board_simulator_command(devices)
    add_xiaozhi_simulator_command(devices)


def add_domain_commands(sub: Subparsers) -> None:
    from gateway.cli.asr import add_asr_commands  # noqa: PLC0415
    from gateway.cli.broker import add_credentials_commands  # noqa: PLC0415
    from gateway.cli.device import add_device_commands  # noqa: PLC0415
    from gateway.cli.lesson import add_lesson_commands  # noqa: PLC0415
    from gateway.cli.reassess import add_reassess_command  # noqa: PLC0415
    from gateway.console.cli import add_user_commands  # noqa: PLC0415
    from gateway.doctor import add_doctor_command  # noqa: PLC0415

    add_credentials_commands(sub)
    add_asr_commands(sub)
    add_reassess_command(sub)
    add_device_commands(sub)
    add_lesson_commands(sub)
    add_user_commands(sub)
    add_doctor_command(sub)
    add_catalog_commands(sub)
    add_simulator_commands(sub)
