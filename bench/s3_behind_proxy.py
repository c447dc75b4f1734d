"""The training-data benchmarks' object store: a moto S3 server behind bench/latency_proxy.py
(each request delayed), one data-prep output uploaded to s3://bench/prep, the process's S3
clients pointed at the proxy, and every block GET counted.

    with s3_behind_proxy(prepared_dir, delay_ms=20) as fetched:  # fetched: [(key, start, bytes)]
        ...StreamingSource("s3://bench/prep", ...)...
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUCKET = "bench"
PREFIX = f"s3://{BUCKET}/prep"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int) -> None:
    for _ in range(200):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit(f"nothing listens on port {port}")


@contextlib.contextmanager
def s3_behind_proxy(data: Path, delay_ms: float) -> Iterator[list[tuple[str, int, int]]]:
    """Serve `data` at PREFIX through a proxy adding `delay_ms` to each request; yields the list
    the block GETs (S3Bucket.get_range_sized) are recorded in, as (key, start, bytes)."""
    import boto3

    from lmforge.common.s3 import S3Bucket

    moto_port, proxy_port = free_port(), free_port()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
           "AWS_DEFAULT_REGION": "us-east-1", "LMFORGE_S3_ANONYMOUS": "0"}
    moto = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(moto_port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proxy = subprocess.Popen([sys.executable, str(HERE / "latency_proxy.py"), "--target",
                              f"http://127.0.0.1:{moto_port}", "--delay-ms", str(delay_ms), "--port",
                              str(proxy_port)], stdout=subprocess.DEVNULL)
    fetched: list[tuple[str, int, int]] = []
    original = S3Bucket.get_range_sized

    def counted(self, key, start, length):
        data_, total = original(self, key, start, length)
        fetched.append((key, start, len(data_)))
        return data_, total

    S3Bucket.get_range_sized = counted
    saved = dict(os.environ)
    try:
        wait_for_port(moto_port)
        wait_for_port(proxy_port)
        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{moto_port}", region_name="us-east-1",
                              aws_access_key_id="bench", aws_secret_access_key="bench")
        client.create_bucket(Bucket=BUCKET)
        for path in sorted(data.rglob("*")):
            if path.is_file():
                client.upload_file(str(path), BUCKET, f"prep/{path.relative_to(data).as_posix()}")
        os.environ.update(env, AWS_ENDPOINT_URL=f"http://127.0.0.1:{proxy_port}")
        yield fetched
    finally:
        S3Bucket.get_range_sized = original
        os.environ.clear()
        os.environ.update(saved)
        for process in (proxy, moto):
            process.terminate()
            process.wait(10)
