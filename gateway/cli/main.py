"""``snlpgw`` — the command line: run the gateway, provision credentials, check catalogs,
simulate devices. Each sub-command lives with its domain; this module only dispatches."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway import __version__
from gateway.logs import setup_logging
from gateway.settings import Settings, load_settings


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {}
    if getattr(args, "data_dir", None) is not None:
        overrides["data_dir"] = args.data_dir
    return load_settings(args.config, **overrides)


def _leaves(group: BaseExceptionGroup[OSError]) -> list[OSError]:
    """The exceptions in a (nested: one TaskGroup inside another) exception group."""
    out: list[OSError] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def _cmd_run(args: argparse.Namespace) -> int:
    settings = _settings(args)
    setup_logging(settings.ops.log_level, json_lines=settings.ops.log_json)
    from gateway.broker.credentials import gateway_secret  # noqa: PLC0415

    secret = gateway_secret(settings)
    if settings.mqtt.password_file is not None and secret.password is None:
        # asked for a shared secret and there is none: a refused login retried forever helps
        # nobody (unset, the data dir's file may be absent on purpose: a broker without auth)
        print(f"snlpgw: cannot start: {secret.problem}", file=sys.stderr)  # noqa: T201
        return 2
    from gateway.app import build_service  # noqa: PLC0415 - keeps `snlpgw provision` light

    async def main() -> None:
        service = build_service(settings)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # HUP: terminal closed
            loop.add_signal_handler(sig, stop.set)
        await service.serve(until=stop)  # a cancelled broker connect is settled inside

    failed: list[OSError] = []
    try:
        asyncio.run(main())
    except* OSError as group:  # a port in use, a bad bind address: say which, no traceback
        failed.extend(_leaves(group))
    for exc in failed:
        print(f"snlpgw: cannot start: {exc}", file=sys.stderr)  # noqa: T201 - CLI output
    return 2 if failed else 0


def _cmd_dev_run(args: argparse.Namespace) -> int:
    from gateway.devrun import dev_run  # noqa: PLC0415

    return dev_run(_settings(args), args.config)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="snlpgw", description=__doc__)
    parser.add_argument("--version", action="version", version=f"snlpgw {__version__}")
    parser.add_argument(
        "--config", type=Path, help="TOML settings file (SNLPGW_* env overrides it)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the gateway in the foreground")
    run.add_argument("--data-dir", type=Path, help="override data_dir")
    run.set_defaults(func=_cmd_run)

    dev = sub.add_parser(
        "dev-run", help="local Mosquitto + gateway, supervised (what `make run` runs)"
    )
    dev.set_defaults(func=_cmd_dev_run)

    from gateway.cli.subcommands import add_domain_commands  # noqa: PLC0415

    add_domain_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
