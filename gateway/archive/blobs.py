"""Where archived answers live: content-addressed blobs (the id is the SHA-256 of the Ogg file).

* :class:`FileBlobs` (default): ``<data_dir>/audio/ab/abcd….opus``, written atomically (a
  temporary file renamed into place), readable by the gateway's user only.
* :class:`S3Blobs` (``archive.s3_url``): one S3-compatible bucket that several gateways share,
  through boto3 — AWS's own maintained client. Its calls are blocking; the archive runs every
  blob call on its own one-thread executor, off the event loop, so an async client
  (aiobotocore, whose API tracks botocore's private internals) buys nothing here.

Every method is synchronous and called on the archive's thread. An id is checked against the
content-address pattern before it names a path or a key.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol

from gateway.archive.links import AUDIO_ID


class BlobMissing(KeyError):
    """No blob under that id."""


def content_id(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _checked(audio_id: str) -> str:
    if not AUDIO_ID.match(audio_id):
        raise BlobMissing(audio_id)
    return audio_id


class AudioBlobs(Protocol):
    where: str  # for logs: a directory or an endpoint/bucket (never a secret)

    def prepare(self) -> None: ...

    def put(self, audio_id: str, data: bytes) -> None: ...

    def get(self, audio_id: str) -> bytes: ...

    def delete(self, audio_id: str) -> None: ...

    def ids(self) -> list[str]: ...


class FileBlobs:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.where = str(root)

    def _path(self, audio_id: str) -> Path:
        audio_id = _checked(audio_id)
        return self.root / audio_id[:2] / f"{audio_id}.opus"

    def prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)

    def put(self, audio_id: str, data: bytes) -> None:
        path = self._path(audio_id)
        if path.exists():
            return  # content-addressed: the same bytes are already there
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def get(self, audio_id: str) -> bytes:
        try:
            return self._path(audio_id).read_bytes()
        except FileNotFoundError:
            raise BlobMissing(audio_id) from None

    def delete(self, audio_id: str) -> None:
        path = self._path(audio_id)
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # only if empty

    def ids(self) -> list[str]:
        if not self.root.exists():
            return []
        return sorted(p.stem for p in self.root.glob("*/*.opus"))


class S3Blobs:
    PREFIX = "audio/"

    def __init__(
        self,
        *,
        endpoint_url: str,
        bucket: str,
        region: str,
        access_key: str | None,
        secret_key: str | None,
        client: Any = None,
    ) -> None:
        self.bucket = bucket
        self.where = f"{endpoint_url} bucket {bucket}"
        if client is None:
            import boto3  # noqa: PLC0415  # only an S3 archive needs the SDK
            from botocore.config import Config  # noqa: PLC0415

            client = boto3.client(
                "s3",
                endpoint_url=endpoint_url,
                region_name=region,
                aws_access_key_id=access_key,
                aws_secret_access_key=secret_key,
                config=Config(
                    connect_timeout=5,
                    read_timeout=10,
                    retries={"max_attempts": 3, "mode": "standard"},
                    s3={"addressing_style": "path"},
                ),
            )
        self._s3 = client

    def _key(self, audio_id: str) -> str:
        audio_id = _checked(audio_id)
        return f"{self.PREFIX}{audio_id[:2]}/{audio_id}.opus"

    def prepare(self) -> None:
        """Create the bucket if it is missing (a shared bucket made by another gateway: fine)."""
        from botocore.exceptions import ClientError  # noqa: PLC0415

        try:
            self._s3.head_bucket(Bucket=self.bucket)
        except ClientError:
            try:
                self._s3.create_bucket(Bucket=self.bucket)
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code")
                if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise

    def put(self, audio_id: str, data: bytes) -> None:
        self._s3.put_object(
            Bucket=self.bucket, Key=self._key(audio_id), Body=data, ContentType="audio/ogg"
        )

    def get(self, audio_id: str) -> bytes:
        from botocore.exceptions import ClientError  # noqa: PLC0415

        try:
            answer = self._s3.get_object(Bucket=self.bucket, Key=self._key(audio_id))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise BlobMissing(audio_id) from None
            raise
        body: bytes = answer["Body"].read()
        return body

    def delete(self, audio_id: str) -> None:
        self._s3.delete_object(Bucket=self.bucket, Key=self._key(audio_id))

    def ids(self) -> list[str]:
        out: list[str] = []
        pages = self._s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.PREFIX
        )
        for page in pages:
            for item in page.get("Contents", []):
                out.append(item["Key"].rsplit("/", 1)[-1].removesuffix(".opus"))
        return sorted(out)
