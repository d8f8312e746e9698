"""The learning record's audio archive (issue #29): each lesson step's answer kept as the
device's own Opus packets in Ogg Opus, on the filesystem or S3-compatible storage, with
retention, a per-device quota, erasure and signed links. See :mod:`gateway.archive.service`
and docs/privacy.md.

Wiring (composition root)::

    archive = build_archive(ctx, parts.store)    # None when archive.enabled is off
    TaskService(..., archive=archive)            # the actors submit each step's answer
    components.append(archive)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.archive.blobs import AudioBlobs, BlobMissing, FileBlobs, S3Blobs, content_id
from gateway.archive.links import LinkCheck, SignedAudioLink, check_audio_link, sign_audio_link
from gateway.archive.ogg import OggOpusContent, demux_ogg_opus, mux_ogg_opus
from gateway.archive.service import AnswerArchive, ForgetReport

if TYPE_CHECKING:
    from gateway.service import Context
    from gateway.settings import ArchiveSettings, Settings
    from gateway.store import Store

__all__ = [
    "AnswerArchive",
    "AudioBlobs",
    "BlobMissing",
    "FileBlobs",
    "ForgetReport",
    "LinkCheck",
    "OggOpusContent",
    "S3Blobs",
    "SignedAudioLink",
    "blobs_for",
    "build_archive",
    "check_audio_link",
    "content_id",
    "demux_ogg_opus",
    "mux_ogg_opus",
    "sign_audio_link",
]


def blobs_for(settings: Settings) -> AudioBlobs:
    """S3 when ``archive.s3_url`` is set, else files under ``archive.dir`` (or data_dir)."""
    archive: ArchiveSettings = settings.archive
    if archive.s3_url:
        return S3Blobs(
            endpoint_url=archive.s3_url,
            bucket=archive.s3_bucket,
            region=archive.s3_region,
            access_key=archive.s3_access_key.get_secret_value() if archive.s3_access_key else None,
            secret_key=archive.s3_secret_key.get_secret_value() if archive.s3_secret_key else None,
        )
    return FileBlobs(archive.dir or settings.data_dir / "audio")


def build_archive(ctx: Context, store: Store) -> AnswerArchive | None:
    """The archive with its admin routes, or None when ``archive.enabled`` is off."""
    settings = ctx.settings
    if not settings.archive.enabled:
        return None
    return AnswerArchive(
        settings=settings.archive,
        store=store,
        blobs=blobs_for(settings),
        metrics=ctx.metrics,
        alarm=ctx.ops.alarm,
        admin=ctx.admin,
    )
