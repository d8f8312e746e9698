"""A real S3-compatible HTTP server for tests: moto's server mode (``moto_server``, the
``moto[server]`` dev dependency) as a child process on a free loopback port. Ready means a real
S3 request (list buckets) succeeded, never after a sleep; each test gets a bucket of its own.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
from botocore.config import Config

from devstack.broker import free_port

READY_TIMEOUT_S = 60.0  # moto imports a lot; on two busy cores it took ~10 s
ACCESS_KEY = "test-access"
SECRET_KEY = "test-secret"  # moto accepts any pair


@dataclass
class S3Server:
    url: str
    proc: subprocess.Popen[bytes]

    def client(self) -> object:
        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )

    def new_bucket_name(self) -> str:
        return f"t-{uuid.uuid4().hex[:12]}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _moto_server() -> str:
    beside = Path(sys.executable).with_name("moto_server")
    found = str(beside) if beside.exists() else shutil.which("moto_server")
    if found is None:
        raise RuntimeError("moto_server missing: `make setup` installs the dev extra moto[server]")
    return found


@contextlib.contextmanager
def s3_server() -> Iterator[S3Server]:
    port = free_port()
    proc = subprocess.Popen(  # our own venv's moto_server
        [_moto_server(), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = S3Server(f"http://127.0.0.1:{port}", proc)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        client = server.client()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with {proc.returncode}")
            try:
                client.list_buckets()  # type: ignore[attr-defined]
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # a process starting up: nothing to wait on but its socket
        yield server
    finally:
        server.stop()
