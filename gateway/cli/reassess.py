"""``snlpgw reassess (--instance ID | --device DEV | --since DATE [--until DATE])``: re-run ASR
and metrics on archived answers with the configured engine (or ``--engine``), each result kept
as its own (engine, version) row beside the original (``gateway/assessment/reassess.py``).

Runs against the store and the archive the settings name (the same ones the gateway uses; it may
be running). Prints one JSON summary; exit 0 when nothing failed, 1 when some answers could not
be re-assessed (they are tried again next time), 2 on a bad selection or an unreachable store.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, date, datetime
from typing import Any

from gateway.settings import load_settings


def _day_ms(text: str) -> int:
    try:
        day = date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a date YYYY-MM-DD") from None
    return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() * 1000)


def add_reassess_command(sub: Any) -> None:  # argparse._SubParsersAction (private)
    p = sub.add_parser(
        "reassess", help="re-run ASR and metrics on archived answers (kept beside the old ones)"
    )
    p.add_argument("--instance", help="one task instance id")
    p.add_argument("--device", help="every archived answer of this device")
    p.add_argument("--since", type=_day_ms, help="instances created on or after (YYYY-MM-DD, UTC)")
    p.add_argument("--until", type=_day_ms, help="instances created before (YYYY-MM-DD, UTC)")
    p.add_argument(
        "--engine", choices=("pocketsphinx", "http"), help="default: the settings' asr.engine"
    )
    p.add_argument("--http-url", help="with --engine http: the transcription endpoint")
    p.add_argument("--http-model", help="with --engine http: the model name (the row's version)")
    p.set_defaults(func=_cmd_reassess)


def _cmd_reassess(args: argparse.Namespace) -> int:
    from gateway.archive import blobs_for  # noqa: PLC0415 - keeps the CLI light
    from gateway.assessment.factory import build_backend  # noqa: PLC0415
    from gateway.assessment.reassess import (  # noqa: PLC0415
        ReassessSelection,
        engine_identity,
        reassess,
    )
    from gateway.store import Store  # noqa: PLC0415
    from gateway.store.dialect import connector_for  # noqa: PLC0415
    from gateway.store.errors import StoreError  # noqa: PLC0415

    overrides: dict[str, Any] = {}
    if getattr(args, "data_dir", None) is not None:
        overrides["data_dir"] = args.data_dir
    settings = load_settings(args.config, **overrides)
    try:
        selection = ReassessSelection(args.instance, args.device, args.since, args.until)
    except ValueError:
        sys.stderr.write(
            "snlpgw reassess: give --instance, --device or --since / "
            "请指定 --instance、--device 或 --since\n"
        )
        return 2
    asr = settings.asr
    changes = {
        k: v
        for k, v in (
            ("engine", args.engine),
            ("http_url", args.http_url),
            ("http_model", args.http_model),
        )
        if v is not None
    }
    asr = asr.model_copy(update=changes)
    backend = build_backend(asr)
    if backend is None:
        sys.stderr.write("snlpgw reassess: asr.engine is none / 未配置语音识别引擎\n")
        return 2

    async def main() -> dict[str, int]:
        store = Store(connect=connector_for(settings.store.url, settings.sqlite_path))
        async with asyncio.TaskGroup() as tg:
            writer = tg.create_task(store.run(), name="reassess.store")
            try:
                report = await reassess(
                    store=store,
                    blobs=blobs_for(settings),
                    backend=backend,
                    identity=engine_identity(asr),
                    selection=selection,
                    job_timeout_s=asr.job_timeout_s,
                )
            finally:
                writer.cancel()
        return {
            "selected": report.selected,
            "assessed": report.assessed,
            "already": report.already,
            "missing_audio": report.missing_audio,
            "failed": report.failed,
        }

    failed: list[BaseException] = []
    summary: dict[str, int] = {}
    try:
        summary = asyncio.run(main())
    except* StoreError as group:
        failed.extend(group.exceptions)
    if failed:
        sys.stderr.write(f"snlpgw reassess: the store cannot be read / 无法读取存储: {failed[0]}\n")
        return 2
    sys.stdout.write(json.dumps(summary) + "\n")
    return 1 if summary["failed"] else 0
