"""The local S3-compatible store (moto's server) that stands in for the bucket: checkpoints are
uploaded to it and restored from it. The demo reads and writes it through lmforge's own storage
layer (S3Bucket, the Store), with the demo's credentials."""

from __future__ import annotations

import sys

from lmforge.common.s3 import S3Bucket
from lmforge.common.storage import open_store
from lmforge.common.store import Store
from lmforge.demo.processes import Supervisor, wait_http_ok

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "lmforge-demo", "AWS_SECRET_ACCESS_KEY": "lmforge-demo",
               "AWS_DEFAULT_REGION": "us-east-1", "LMFORGE_S3_ANONYMOUS": "0"}


def s3_env(endpoint: str) -> dict[str, str]:
    """What a process needs to use the local store with the standard AWS client chain."""
    return {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}


def start_s3(supervisor: Supervisor, port: int, bucket: str) -> str:
    """moto's S3 server on 127.0.0.1:`port` with `bucket` created; returns its endpoint."""
    process = supervisor.start("s3", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)])
    endpoint = f"http://127.0.0.1:{port}"
    wait_http_ok(f"{endpoint}/moto-api/", process, "the S3 server (moto)", timeout=60)
    objects = S3Bucket(bucket, endpoint, credentials=s3_env(endpoint), concurrency=1)
    try:
        objects.create()
    finally:
        objects.close()
    return endpoint


def demo_store(uri: str, storage: dict[str, str]) -> Store:
    """The Store at `uri` (s3://BUCKET/PREFIX) in the local store `storage` (s3_env's variables) describes."""
    return open_store(uri, endpoint_url=storage["AWS_ENDPOINT_URL"], credentials=storage)
