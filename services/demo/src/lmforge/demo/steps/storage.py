"""The local S3-compatible store (moto's server) that stands in for the bucket: checkpoints are
uploaded to it and restored from it."""

from __future__ import annotations

import sys

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
    s3_client(s3_env(endpoint)).create_bucket(Bucket=bucket)
    return endpoint


def s3_client(storage: dict[str, str]):
    """A boto3 client for the store `storage` (s3_env's variables) describes."""
    import boto3

    return boto3.client("s3", endpoint_url=storage["AWS_ENDPOINT_URL"], region_name=storage["AWS_DEFAULT_REGION"],
                        aws_access_key_id=storage["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=storage["AWS_SECRET_ACCESS_KEY"])
