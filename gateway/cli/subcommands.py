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


def add_catalog_commands(sub: Subparsers) -> None:
    catalog = sub.add_parser("catalog", help="task catalog tools")
    catalog_sub = catalog.add_subparsers(dest="catalog_command", required=True)
    check = catalog_sub.add_parser("check", help="validate a catalog file or directory")
    check.add_argument("path", type=Path)
    check.add_argument("--resource-dir", type=Path, help="local resources (clip .txt transcripts)")
    check.set_defaults(func=_catalog_check)


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
    from gateway.cli.reassess import add_reassess_command  # noqa: PLC0415
    from gateway.doctor import add_doctor_command  # noqa: PLC0415

    add_credentials_commands(sub)
    add_asr_commands(sub)
    add_reassess_command(sub)
    add_device_commands(sub)
    add_doctor_command(sub)
    add_catalog_commands(sub)
    add_simulator_commands(sub)
