"""Doctor checks that need no running gateway: audio libraries, ASR engine, store, clock."""

from __future__ import annotations

import asyncio
import contextlib
import math
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path

from gateway.doctor.report import Row, fail, ok, skip
from gateway.settings import Settings

SAMPLE_RATE = 16_000
ASR_TIMEOUT_S = 30.0
CLOCK_FLOOR = datetime(2025, 1, 1, tzinfo=UTC)  # a clock before this was never set
MAX_SKEW_S = 5.0


def tone_pcm(ms: int = 1000) -> bytes:
    """A voiced-looking 16 kHz s16le tone (200 Hz and harmonics), so engines really decode."""
    n = SAMPLE_RATE * ms // 1000
    out = bytearray()
    for i in range(n):
        t = i / SAMPLE_RATE
        v = sum(math.sin(2 * math.pi * 200 * k * t) / k for k in (1, 2, 3))
        out += int(6000 * v).to_bytes(2, "little", signed=True)
    return bytes(out)


def check_audio_libs() -> Row:
    name = "audio libraries"
    try:
        import webrtcvad  # noqa: PLC0415 - the check is that it loads

        from codec.opus import OpusStreamDecoder  # noqa: PLC0415

        decoder = OpusStreamDecoder()
        try:
            pcm = decoder.conceal(1)  # runs libopus (packet-loss concealment of one frame)
        finally:
            decoder.close()
        voiced = webrtcvad.Vad(2).is_speech(pcm[: SAMPLE_RATE * 30 // 1000 * 2], SAMPLE_RATE)
    except (ImportError, OSError) as exc:
        return fail(name, f"libopus/webrtcvad not usable: {exc}")
    return ok(name, f"libopus decoded a {len(pcm) // 32} ms frame; webrtcvad answered ({voiced})")


def check_asr(settings: Settings) -> Row:
    name = "ASR engine"
    asr = settings.asr
    if asr.engine == "none":
        return skip(name, "asr.engine = none: nothing is transcribed")
    pcm = tone_pcm()
    started = time.monotonic()
    try:
        if asr.engine == "http":
            from gateway.assessment.http_engine import HttpAsrEngine  # noqa: PLC0415

            async def once() -> object:
                engine = HttpAsrEngine(
                    url=asr.http_url, model=asr.http_model, timeout_s=asr.http_timeout_s, retries=0
                )
                try:
                    return await engine.transcribe(pcm)
                finally:
                    await engine.aclose()

            result = asyncio.run(once())
        else:
            from gateway.assessment.sphinx import PocketsphinxEngine  # noqa: PLC0415

            with ThreadPoolExecutor(1, thread_name_prefix="doctor-asr") as pool:
                result = pool.submit(lambda: PocketsphinxEngine().transcribe(pcm)).result(
                    ASR_TIMEOUT_S
                )
    except FutureTimeout:
        return fail(name, f"{asr.engine}: no answer within {ASR_TIMEOUT_S:.0f}s")
    except Exception as exc:
        return fail(name, f"{asr.engine}: {type(exc).__name__}: {exc}"[:200])
    from gateway.assessment.jobs import AsrResult  # noqa: PLC0415

    elapsed = (time.monotonic() - started) * 1000
    if not isinstance(result, AsrResult):
        return fail(name, f"{asr.engine}: {result}"[:200])
    where = f" at {asr.http_url}" if asr.engine == "http" else ""
    return ok(name, f"{asr.engine}{where} transcribed 1 s of audio in {elapsed:.0f} ms")


def check_store(settings: Settings) -> Row:
    name = "store writable"
    from gateway.store.dialect import Dialect, connector_for  # noqa: PLC0415

    connector = connector_for(settings.store.url, settings.sqlite_path)
    if connector.dialect is Dialect.SQLITE:
        directory = Path(connector.where).parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=directory, prefix=".doctor-"):
                pass
        except OSError as exc:
            return fail(name, f"cannot write in {directory}: {exc.strerror or exc}")
    try:
        conn = connector.connect()
    except Exception as exc:
        return fail(name, f"cannot open {connector.where}: {exc}"[:200])
    try:
        if connector.dialect is Dialect.SQLITE:
            conn.execute("BEGIN IMMEDIATE")  # takes the write lock: fails on a read-only file
        else:
            conn.execute("BEGIN")
            conn.execute("CREATE TEMP TABLE doctor_probe (x integer)")
            conn.execute("INSERT INTO doctor_probe VALUES (1)")
        conn.execute("ROLLBACK")
    except Exception as exc:
        return fail(name, f"{connector.where} is not writable: {exc}"[:200])
    finally:
        with contextlib.suppress(Exception):
            conn.close()
    return ok(name, f"{connector.dialect.value} {connector.where} takes writes")


def check_clock(server_date: str | None, seen: datetime | None = None) -> Row:
    """Wall clock set (not before 2025) and, given the gateway's HTTP ``Date`` and our clock
    when it arrived (``seen``; default now), in step with it. Comparing with the time of this
    check instead counted the checks in between (seconds on a loaded machine) as skew."""
    name = "clock"
    now = datetime.now(UTC)
    if now < CLOCK_FLOOR:
        return fail(name, f"system clock says {now:%Y-%m-%d}: not set (NTP?)")
    detail = f"{now:%Y-%m-%dT%H:%M:%SZ}"
    if server_date is not None:
        with contextlib.suppress(TypeError, ValueError):
            skew = ((seen or now) - parsedate_to_datetime(server_date)).total_seconds()
            if abs(skew) > MAX_SKEW_S:
                side = "behind" if skew > 0 else "ahead of"
                return fail(name, f"{detail}; the gateway's clock is {abs(skew):.0f}s {side} ours")
            detail += f"; gateway's HTTP Date within {MAX_SKEW_S:.0f}s"
    sync = Path("/run/systemd/timesync/synchronized")
    if sync.exists():
        detail += "; systemd-timesyncd synchronized"
    return ok(name, detail)
