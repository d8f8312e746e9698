"""`snlpgw broker init` and `snlpgw provision`: the CLI face of :mod:`gateway.broker`.

:func:`gateway.cli.subcommands.add_domain_commands` calls :func:`add_credentials_commands`; each
sub-command stores its handler as ``func`` (``args.func(args) -> int``), as
:mod:`gateway.cli.main` expects. Passwords go to stdout only (as JSON, for the operator or a provisioning script), never to the log.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gateway.broker.credentials import Credentials, init_broker_files, provision
from gateway.broker.io import Reloader, reloader_for
from gateway.broker.layout import (
    BrokerFiles,
    device_listener_port,
    local_broker_url,
    local_listener,
)
from gateway.broker.rules import (
    DEVICE_PORT_OFFSET,
    CredentialsError,
    Role,
    default_device_port,
)
from gateway.cli.subcommands import Subparsers
from gateway.mqtt.probe import await_login, connack
from gateway.settings import load_settings

VERIFY_S = 3.0


def add_credentials_commands(subparsers: Subparsers) -> None:
    broker = subparsers.add_parser("broker", help="manage the local Mosquitto files")
    broker_sub = broker.add_subparsers(dest="broker_command", required=True)
    init = broker_sub.add_parser(
        "init", help="write mosquitto.conf, passwd and acl under <data-dir>/mosquitto/"
    )
    _data_dir_option(init)
    init.add_argument("--host", default="127.0.0.1", help="listener address (127.0.0.1)")
    init.add_argument(
        "--port", type=int, default=1883, help="the gateway's listener (1883): no device users"
    )
    init.add_argument(
        "--device-port",
        type=int,
        default=None,
        help="the boards' listener, with client id = user name (no id takeover) and device "
        f"users only (default: --port + {DEVICE_PORT_OFFSET})",
    )
    init.set_defaults(func=cmd_broker_init)

    prov = subparsers.add_parser(
        "provision", help="create a broker user (or rotate its password); prints JSON"
    )
    prov.add_argument("name", help="device id (aa_bb_cc_dd_ee_ff) or ops/backend user name")
    prov.add_argument(
        "--role", choices=[r.value for r in Role], default=Role.DEVICE.value, help="(device)"
    )
    prov.add_argument(
        "--no-rotate", action="store_true", help="keep an existing user's password (not printed)"
    )
    prov.add_argument(
        "--broker-url", default=None, help="URL to print (default: the local broker's listener)"
    )
    prov.add_argument(
        "--reload-command",
        default=None,
        help="command that reloads a broker the pid file cannot reach, e.g. "
        "'docker exec mosquitto kill -HUP 1' (run without a shell)",
    )
    _data_dir_option(prov)
    prov.set_defaults(func=cmd_provision)


def _data_dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="data directory (settings: data_dir)"
    )


def _data_dir(args: argparse.Namespace) -> Path:
    if args.data_dir is not None:
        return Path(args.data_dir)
    return load_settings(getattr(args, "config", None)).data_dir


def cmd_broker_init(args: argparse.Namespace) -> int:
    device_port = args.device_port or default_device_port(args.port)
    files = init_broker_files(
        _data_dir(args),
        listener_host=args.host,
        listener_port=args.port,
        device_port=device_port,
    )
    sys.stdout.write(f"wrote {files.config}, {files.password_file}, {files.acl_file}\n")
    sys.stdout.write(
        f"listeners: gateway and local tools {args.host}:{args.port}, "
        f"devices {args.host}:{device_port}\n"
    )
    sys.stdout.write(f"start the broker with: mosquitto -c {files.config}\n")
    return 0


def cmd_provision(args: argparse.Namespace) -> int:
    data_dir = _data_dir(args)
    files = BrokerFiles.at(data_dir)
    reload = _Reload(reloader_for(args.reload_command, files.pid_file))
    try:
        creds = provision(
            data_dir, args.name, role=Role(args.role), rotate=not args.no_rotate, reload=reload
        )
    except CredentialsError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    # The files are written: whatever happens now, the new password is printed.
    confirmed = reload.failed is not None or _accepted(data_dir, creds, reload)
    if not confirmed:
        sys.stderr.write(
            f"warning: could not confirm within {VERIFY_S:.0f}s that the broker accepts the new "
            f"password of {creds.username}; it will once the broker reloads its files\n"
        )
    if reload.failed is not None:
        sys.stderr.write(f"warning: reloading the broker failed ({reload.failed}); reload it\n")
    url = args.broker_url or _local_url(data_dir, creds.role) or "mqtt://127.0.0.1:1883"
    sys.stdout.write(json.dumps(creds.as_dict(broker_url=url), indent=2) + "\n")
    return 0


def _local_url(data_dir: Path, role: Role) -> str | None:
    """Where a user of ``role`` logs in on the generated config: devices on the device listener
    (if it has one), everyone else on the first."""
    url = local_broker_url(data_dir)
    listener = local_listener(data_dir)
    device_port = device_listener_port(data_dir)
    if role is Role.DEVICE and listener is not None and device_port is not None:
        return f"mqtt://{listener[0]}:{device_port}"
    return url


class _Reload:
    """The reloader, never raising: a failed reload is remembered and reported, so a rotated
    password is still printed (the files already hold it)."""

    def __init__(self, reload: Reloader) -> None:
        self._reload = reload
        self.failed: str | None = None

    def __call__(self) -> None:
        try:
            self._reload()
        except Exception as exc:
            self.failed = str(exc) or type(exc).__name__


def _accepted(data_dir: Path, creds: Credentials, reload: Reloader) -> bool:
    """Whether the local broker of the generated config accepts ``creds`` now, waiting up to
    :data:`VERIFY_S` for its reload (signalling again if one was lost), so printed credentials
    work at once. True when it cannot be asked here: no password (``--no-rotate``), no generated
    config, no broker answering, or a device and no device listener in that config (a deployed
    config may give devices a listener the generated file does not describe)."""
    listener = local_listener(data_dir)
    if listener is None or creds.password is None:
        return True
    host, port = listener
    host = "127.0.0.1" if host == "0.0.0.0" else host  # noqa: S104 - a listener address
    if creds.role is Role.DEVICE:
        device_port = device_listener_port(data_dir)
        if device_port is None:
            return True
        port = device_port
    first = connack(host, port, creds.username, creds.password, timeout_s=2.0)
    if first is None or first == 0:
        return True  # accepted already, or no broker answers there (it reads the files at start)
    answer = await_login(
        host, port, creds.username, creds.password, within_s=VERIFY_S, reload=reload
    )
    return answer == 0
