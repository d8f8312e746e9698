"""``snlpgw doctor``: is this gateway healthy? One row per check, non-zero exit on any failure.

Rows, in order (a row whose prerequisite failed is ``skip`` and says so):

* gateway secret — the gateway's broker password is found: ``mqtt.password``, else the file
  ``mqtt.password_file``, else ``<data_dir>/secrets/gateway.password``; a missing or empty one
  fails, naming the setting to fix.
* broker reachable, broker credentials — TCP (TLS for mqtts, with the gateway's own context:
  ``mqtt.ca_file``, client certificate; a TLS failure said as the setting to fix) to
  ``mqtt.url``; the gateway user logs in with that password.
* ACL isolation — a throwaway device is provisioned, must read its own ``cmd`` topic and must
  neither read nor write another device's topics; then it is revoked (``acl.py``).
* gateway health, admin metrics — ``GET /healthz`` on the device listener, ``GET /metrics`` on
  the admin listener (with ``http.admin_token`` when set).
* UDP audio port — one junk datagram: "port unreachable" means nothing is bound; the gateway's
  ``snlpgw_xiaozhi_udp_dropped_total`` must count it (so it is the gateway that holds the port).
* audio libraries, ASR engine, store writable, clock — checked in this process (``local.py``).
"""

from __future__ import annotations

import argparse
import sys

from gateway.broker.io import Reloader, reloader_for
from gateway.broker.layout import BrokerFiles
from gateway.cli.subcommands import Subparsers
from gateway.doctor.acl import check_acl
from gateway.doctor.local import check_asr, check_audio_libs, check_clock, check_store
from gateway.doctor.network import (
    Findings,
    check_broker,
    check_gateway_http,
    check_secret,
    check_udp,
)
from gateway.doctor.report import Row, exit_code, render
from gateway.settings import Settings, load_settings


def run_checks(settings: Settings, reload: Reloader) -> list[Row]:
    found = Findings()
    rows = [check_secret(settings), *check_broker(settings, found)]
    rows.append(check_acl(settings, found, reload))
    rows += check_gateway_http(settings, found)
    rows.append(check_udp(settings, found))
    rows.append(check_audio_libs())
    rows.append(check_asr(settings))
    rows.append(check_store(settings))
    rows.append(check_clock(found.server_date, found.server_date_seen))
    return rows


def _cmd_doctor(args: argparse.Namespace) -> int:
    overrides = {} if args.data_dir is None else {"data_dir": args.data_dir}
    settings = load_settings(args.config, **overrides)
    pid_file = BrokerFiles.at(settings.data_dir).pid_file
    reload = reloader_for(args.reload_command or None, pid_file)
    rows = run_checks(settings, reload)
    sys.stdout.write(render(rows))
    return exit_code(rows)


def add_doctor_command(sub: Subparsers) -> None:
    doctor = sub.add_parser(
        "doctor", help="check broker, ACLs, listeners, audio, ASR, store, clock; prints a table"
    )
    doctor.add_argument("--data-dir", default=None, help="override data_dir")
    doctor.add_argument(
        "--reload-command",
        default=None,
        help="how to reload a broker the pid file cannot reach (as for `snlpgw provision`)",
    )
    doctor.set_defaults(func=_cmd_doctor)
