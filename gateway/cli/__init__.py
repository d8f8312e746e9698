"""``snlpgw``, the command line: :mod:`gateway.cli.main` parses and dispatches; the other modules
register sub-commands (:mod:`gateway.cli.subcommands` gathers the domains' ones)."""

from gateway.cli.main import main

__all__ = ["main"]
