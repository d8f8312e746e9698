"""Sub-commands contributed by the gateway's domains (credentials, catalog, simulators)."""

from __future__ import annotations

import argparse
from typing import Any

Subparsers = Any  # argparse's _SubParsersAction is private; typed loosely on purpose


def add_domain_commands(sub: Subparsers) -> None:
    """Each domain adds its own sub-commands here as it lands."""
    _ = argparse
    from gateway.credentials_cli import add_credentials_commands  # noqa: PLC0415

    add_credentials_commands(sub)
