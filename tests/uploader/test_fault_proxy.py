"""The fault-injecting proxy, against the real moto S3 server."""

from __future__ import annotations

import http.client
import io
import os
import socket
import threading
import time
import uuid

import boto3
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError

from tests.uploader.fault_proxy import FaultProxy

# Note: retries={"max_attempts": 1} still allows one *retry*; total_max_attempts=1 is a single attempt.
NO_RETRIES = Config(retries={"total_max_attempts": 1, "mode": "standard"})


def s3_client(url: str, config: Config = NO_RETRIES):
    return boto3.client("s3", endpoint_url=url, region_name="us-east-1", config=config)


@pytest.fixture
def bucket(s3) -> str:
    _, make_bucket = s3
    name = f"fault-proxy-{uuid.uuid4().hex[:12]}"
    make_bucket(name)
    return name


@pytest.fixture
def direct(s3):
    """A client talking to moto without the proxy, to check what really got stored."""
    return s3_client(s3[0])


def exists(client, bucket: str, key: str) -> bool:
    try:
        client.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        assert exc.response["Error"]["Code"] == "404"
        return False
    return True


def test_roundtrip_without_faults(s3_endpoint, bucket, direct):
    with FaultProxy(s3_endpoint) as proxy:
        client = s3_client(proxy.url)
        client.put_object(Bucket=bucket, Key="small.txt", Body=b"hello")
        assert client.get_object(Bucket=bucket, Key="small.txt")["Body"].read() == b"hello"
        assert client.head_object(Bucket=bucket, Key="small.txt")["ContentLength"] == 5

        parts = [os.urandom(5 * 1024 * 1024), os.urandom(1024 * 1024 + 7)]
        upload = client.create_multipart_upload(Bucket=bucket, Key="big.bin")["UploadId"]
        etags = [client.upload_part(Bucket=bucket, Key="big.bin", UploadId=upload, PartNumber=n, Body=data)["ETag"]
                 for n, data in enumerate(parts, 1)]
        client.complete_multipart_upload(
            Bucket=bucket, Key="big.bin", UploadId=upload,
            MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]})
        listed = client.list_objects_v2(Bucket=bucket)["Contents"]
        assert {o["Key"]: o["Size"] for o in listed} == {"small.txt": 5, "big.bin": sum(map(len, parts))}
        assert client.get_object(Bucket=bucket, Key="big.bin")["Body"].read() == b"".join(parts)
        client.delete_object(Bucket=bucket, Key="small.txt")
        assert proxy.stats == {"forwarded": 10, "reset": 0, "error_500": 0, "slow_down": 0, "delay": 0}
    assert direct.get_object(Bucket=bucket, Key="big.bin")["Body"].read() == b"".join(parts)
    assert not exists(direct, bucket, "small.txt")


def test_keep_alive_reuses_connections(s3_endpoint, bucket):
    with FaultProxy(s3_endpoint) as proxy:
        client = s3_client(proxy.url)
        start = time.monotonic()
        for i in range(100):
            client.put_object(Bucket=bucket, Key=f"k{i}", Body=b"x")
        elapsed = time.monotonic() - start
        assert proxy.stats["forwarded"] == 100
        assert proxy.accepted_connections == 1
        assert elapsed < 10


def test_chunked_request_body(s3_endpoint, bucket, direct):
    data = os.urandom(300_000)
    with FaultProxy(s3_endpoint) as proxy:
        conn = http.client.HTTPConnection(proxy.url.removeprefix("http://"), timeout=10)
        pieces = (data[i:i + 65536] for i in range(0, len(data), 65536))
        conn.request("PUT", f"/{bucket}/chunked.bin", body=pieces, encode_chunked=True)
        response = conn.getresponse()
        assert response.status == 200, response.read()
        response.read()
        conn.close()
    assert direct.get_object(Bucket=bucket, Key="chunked.bin")["Body"].read() == data


@pytest.mark.parametrize(("fault", "status", "code"), [("slow_down", 503, "SlowDown"),
                                                       ("error_500", 500, "InternalError")])
def test_error_responses_are_not_forwarded(s3_endpoint, bucket, direct, fault, status, code):
    with FaultProxy(s3_endpoint, **{fault: 1.0}) as proxy:
        client = s3_client(proxy.url)
        with pytest.raises(ClientError) as info:
            client.put_object(Bucket=bucket, Key="k", Body=b"data")
        assert info.value.response["Error"]["Code"] == code
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
        with pytest.raises(ClientError) as info:  # HEAD: no body, so botocore only has the status
            client.head_object(Bucket=bucket, Key="k")
        assert info.value.response["Error"]["Code"] == str(status)
        assert proxy.stats[fault] == 2 and proxy.stats["forwarded"] == 0
    assert not exists(direct, bucket, "k")


def test_reset_drops_the_connection(s3_endpoint, bucket, direct):
    with FaultProxy(s3_endpoint, reset=1.0) as proxy:
        client = s3_client(proxy.url)
        with pytest.raises(ConnectionClosedError):
            client.put_object(Bucket=bucket, Key="k", Body=b"data" * 100_000)
        with pytest.raises(ConnectionClosedError):
            client.get_object(Bucket=bucket, Key="k")
        assert proxy.stats["reset"] == 2 and proxy.stats["forwarded"] == 0
        assert not exists(direct, bucket, "k")

        proxy.set_faults()  # the same client recovers on a fresh connection
        client.put_object(Bucket=bucket, Key="k", Body=b"data")
    assert direct.get_object(Bucket=bucket, Key="k")["Body"].read() == b"data"


def test_delay(s3_endpoint, bucket, direct):
    with FaultProxy(s3_endpoint, delay=1.0, delay_seconds=0.3) as proxy:
        client = s3_client(proxy.url)
        start = time.monotonic()
        client.put_object(Bucket=bucket, Key="k", Body=b"data")
        assert time.monotonic() - start >= 0.3
        assert proxy.stats == {"forwarded": 1, "reset": 0, "error_500": 0, "slow_down": 0, "delay": 1}
    assert direct.get_object(Bucket=bucket, Key="k")["Body"].read() == b"data"


def test_methods_filter_and_faulted_part_did_not_happen(s3_endpoint, bucket, direct):
    with FaultProxy(s3_endpoint, slow_down=1.0, methods={"put"}) as proxy:
        client = s3_client(proxy.url)
        upload = client.create_multipart_upload(Bucket=bucket, Key="big.bin")["UploadId"]  # POST: not faulted
        with pytest.raises(ClientError, match="SlowDown"):
            client.upload_part(Bucket=bucket, Key="big.bin", UploadId=upload, PartNumber=1, Body=b"part")
        assert "Parts" not in direct.list_parts(Bucket=bucket, Key="big.bin", UploadId=upload)
        assert client.list_parts(Bucket=bucket, Key="big.bin", UploadId=upload)["UploadId"] == upload  # GET

        proxy.set_faults()
        client.upload_part(Bucket=bucket, Key="big.bin", UploadId=upload, PartNumber=1, Body=b"part")
        assert [p["PartNumber"] for p in direct.list_parts(Bucket=bucket, Key="big.bin", UploadId=upload)["Parts"]] \
            == [1]
        assert proxy.stats == {"forwarded": 3, "reset": 0, "error_500": 0, "slow_down": 1, "delay": 0}


def outcomes(endpoint: str, bucket: str, seed: int, n: int = 200) -> list[str]:
    """What each of n GETs got through a proxy with 20% faults in all."""
    with FaultProxy(endpoint, reset=0.05, error_500=0.05, slow_down=0.1, seed=seed) as proxy:
        client = s3_client(proxy.url)
        seen = []
        for _ in range(n):
            try:
                client.get_object(Bucket=bucket, Key="k")["Body"].read()
                seen.append("ok")
            except ClientError as exc:
                seen.append(exc.response["Error"]["Code"])
            except ConnectionClosedError:
                seen.append("reset")
        stats = proxy.stats
    assert stats["forwarded"] == seen.count("ok")
    assert (stats["reset"], stats["error_500"], stats["slow_down"]) == \
        (seen.count("reset"), seen.count("InternalError"), seen.count("SlowDown"))
    return seen


def test_fractions_are_honoured_and_reproducible(s3_endpoint, bucket, direct):
    direct.put_object(Bucket=bucket, Key="k", Body=b"data")
    first = outcomes(s3_endpoint, bucket, seed=7)
    assert 20 <= sum(o != "ok" for o in first) <= 60
    assert {"reset", "InternalError", "SlowDown"} <= set(first)
    assert outcomes(s3_endpoint, bucket, seed=7) == first
    assert outcomes(s3_endpoint, bucket, seed=8, n=50) != first[:50]


def test_parallel_multipart_upload_survives_faults_with_retries(s3_endpoint, bucket, direct):
    data = os.urandom(12 * 1024 * 1024)
    retrying = Config(retries={"total_max_attempts": 10, "mode": "standard"})
    transfer = TransferConfig(multipart_threshold=5 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024,
                              max_concurrency=3)
    with FaultProxy(s3_endpoint, reset=0.1, slow_down=0.2, delay=0.1, delay_seconds=0.05, seed=4) as proxy:
        s3_client(proxy.url, retrying).upload_fileobj(io.BytesIO(data), bucket, "big.bin", Config=transfer)
        stats = proxy.stats
    assert stats["reset"] > 0 and stats["slow_down"] > 0  # the seed's first draws include both
    assert direct.get_object(Bucket=bucket, Key="big.bin")["Body"].read() == data


def test_set_faults_validates():
    proxy = FaultProxy("http://127.0.0.1:1")
    with pytest.raises(ValueError):
        proxy.set_faults(reset=0.6, slow_down=0.6)
    with pytest.raises(ValueError):
        proxy.set_faults(delay=-0.1)
    with pytest.raises(ValueError):
        FaultProxy("https://example.com")


def test_unreachable_target_is_a_502():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with FaultProxy(dead) as proxy, pytest.raises(ClientError) as info:
        s3_client(proxy.url).list_buckets()
    assert info.value.response["Error"]["Code"] == "BadGateway"


def test_close_leaves_no_threads(s3_endpoint, bucket):
    def proxy_threads():
        return [t for t in threading.enumerate() if t.name.startswith("fault-proxy-")]

    with FaultProxy(s3_endpoint) as proxy:
        client = s3_client(proxy.url)
        client.put_object(Bucket=bucket, Key="k", Body=b"x")  # leaves an idle keep-alive connection open
        assert len(proxy_threads()) == 2  # accept loop + connection handler
    assert proxy_threads() == []
