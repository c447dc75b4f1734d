"""A real S3 REST endpoint on loopback (moto's standalone server) for tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import boto3


@contextlib.contextmanager
def running_s3_server() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def s3_env(monkeypatch, endpoint: str) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("LMFORGE_S3_ANONYMOUS", "0")


def make_bucket(endpoint: str, name: str):
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_bucket(Bucket=name)
    return client


def upload_tree(client, bucket: str, root, prefix: str) -> None:
    """Every file under `root` to s3://bucket/prefix/<its path under root>."""
    for path in sorted(root.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(root).as_posix()}")
