"""Write the admin listener's OpenAPI document: ``python -m gateway.admin_doc --write``
rewrites ``docs/openapi/admin.json`` (without ``--write`` it prints it). The production gateway
is built with defaults in a scratch data_dir (nothing started or connected) and its admin
server's documented routes rendered by :func:`gateway.openapi.build_document`.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from gateway import __version__
from gateway.app import build_gateway
from gateway.openapi import DOC, build_document
from gateway.settings import load_settings


def admin_document() -> dict[str, Any]:
    """The production gateway's admin document (built with defaults in a scratch data_dir)."""
    with tempfile.TemporaryDirectory() as scratch:
        settings = load_settings(data_dir=Path(scratch), asr={"engine": "none"})
        gw = build_gateway(settings)
        routes = gw.service.ctx.admin.route_docs
        return build_document(routes, title="snlp gateway admin API", version=__version__)


def render() -> str:
    return json.dumps(admin_document(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":  # pragma: no cover - a developer command
    text = render()
    if sys.argv[1:] == ["--write"]:
        DOC.parent.mkdir(parents=True, exist_ok=True)
        DOC.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
