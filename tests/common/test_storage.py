import io
import json
import os

import pytest

from lmforge.common.atomic_files import atomic_open
from lmforge.common.errors import InputError
from lmforge.common.local_store import LocalStore
from lmforge.common.logging import configure_logging
from lmforge.common.s3_store import S3Store
from lmforge.common.storage import expand_inputs, open_input, open_store
from tests.uploader.fault_proxy import FaultProxy

MIB = 1 << 20


def test_local_store_atomic_write(tmp_path):
    store = LocalStore(tmp_path)
    store.write_text("a/b.txt", "one")
    with pytest.raises(RuntimeError), store.open_write("a/b.txt") as fh:
        fh.write(b"partial")
        raise RuntimeError("killed mid-write")
    assert store.read_text("a/b.txt") == "one"
    assert store.list("a") == ["a/b.txt"]
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".tmp")]


def test_atomic_open_creates_parents(tmp_path):
    with atomic_open(tmp_path / "x" / "y.bin") as fh:
        fh.write(b"data")
    assert (tmp_path / "x" / "y.bin").read_bytes() == b"data"


def test_expand_local_globs(tmp_path):
    for name in ("b.wet.gz", "a.wet.gz", "c.txt"):
        (tmp_path / name).write_bytes(b"x")
    assert expand_inputs([str(tmp_path / "*.wet.gz")]) == [str(tmp_path / "a.wet.gz"), str(tmp_path / "b.wet.gz")]
    with pytest.raises(InputError, match="matched no files"):
        expand_inputs([str(tmp_path / "*.warc")])


def test_open_missing_local_input():
    with pytest.raises(InputError, match="cannot open input"):
        open_input("/nonexistent/file.wet")


@pytest.mark.parametrize("uri", ["http://127.0.0.1:9/a wet file.warc.wet.gz", "/tmp/bad\x00name.wet"])
def test_malformed_input_uri_is_an_input_error_not_a_crash(uri):
    with pytest.raises(InputError, match="cannot open input"):
        open_input(uri)


def test_s3_store_and_inputs(s3):
    endpoint, make_bucket = s3
    client = make_bucket("lmf-store")
    client.put_object(Bucket="lmf-store", Key="raw/one.wet", Body=b"hello")
    client.put_object(Bucket="lmf-store", Key="raw/two.wet", Body=b"world")
    assert expand_inputs(["s3://lmf-store/raw/*.wet"]) == ["s3://lmf-store/raw/one.wet", "s3://lmf-store/raw/two.wet"]
    with open_input("s3://lmf-store/raw/two.wet") as fh:
        assert fh.read() == b"world"
    with pytest.raises(InputError):
        open_input("s3://lmf-store/raw/missing.wet")

    store = open_store("s3://lmf-store/out/run1")
    assert isinstance(store, S3Store)
    store.write_text("work/a.json", "{}")
    with pytest.raises(RuntimeError), store.open_write("work/b.json") as fh:
        fh.write(b"half")
        raise RuntimeError("killed")
    assert store.exists("work/a.json") and not store.exists("work/b.json")
    assert store.list("work") == ["work/a.json"]
    copy = store.local_path("work/a.json")
    assert copy.read_text() == "{}"
    store.release_local_copies()  # the copy goes; a new one is made when asked for again
    assert not copy.exists() and store.local_path("work/a.json").read_text() == "{}"
    with store.open_read("work/a.json") as fh:  # ranged reads, no local copy
        assert fh.read() == b"{}"


def test_s3_store_writes_verified_parts_and_retries_each_request_once_per_fault(s3, s3_endpoint, monkeypatch):
    """S3Store goes through lmforge.common.s3: multipart with a CRC32C per part, and every faulted
    request retried by the one retry policy alone (botocore's retries are off: one retry line per fault)."""
    _, make_bucket = s3
    direct = make_bucket("lmf-faults")
    data = os.urandom(20 * MIB)  # three parts of 8 MiB
    stream = io.StringIO()
    configure_logging("INFO", stream=stream)
    with FaultProxy(s3_endpoint, error_500=0.15, slow_down=0.15, reset=0.1, seed=3) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        store = open_store("s3://lmf-faults/run")
        store.write_bytes("big.bin", data)
        store.write_text("small.json", "{}")
        assert store.list() == ["big.bin", "small.json"]
        assert store.local_path("big.bin").read_bytes() == data
        with store.open_read("big.bin") as fh:
            fh.seek(-100, io.SEEK_END)
            assert fh.read() == data[-100:]
            fh.seek(5 * MIB)
            assert fh.read(3 * MIB) == data[5 * MIB : 8 * MIB]
        faults = proxy.stats
    injected = faults["error_500"] + faults["slow_down"] + faults["reset"]
    retries = [json.loads(line) for line in stream.getvalue().splitlines() if '"retrying"' in line]
    assert injected >= 2 and len(retries) == injected, (faults, retries)
    assert {r["service"] for r in retries} == {"storage"}
    attributes = direct.get_object_attributes(Bucket="lmf-faults", Key="run/big.bin", ObjectAttributes=["Checksum"])
    assert attributes["Checksum"]["ChecksumType"] == "COMPOSITE" and attributes["Checksum"]["ChecksumCRC32C"]
    assert direct.get_object(Bucket="lmf-faults", Key="run/small.json")["Body"].read() == b"{}"
    assert not direct.list_multipart_uploads(Bucket="lmf-faults").get("Uploads")
