"""One Store interface, two implementations: every operation behaves the same on a local
directory and on an s3:// prefix (moto's server), and errors mean the same on both."""

from __future__ import annotations

import hashlib
import os
import threading
import uuid

import pytest
from botocore.exceptions import ClientError

from lmforge.common.errors import StorageError
from lmforge.common.local_store import LocalStore
from lmforge.common.retry import Cancelled
from lmforge.common.s3_store import S3Store
from lmforge.common.storage import open_store
from lmforge.common.store import AccessDenied, ObjectMissing

MIB = 1 << 20


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        yield open_store(f"file://{tmp_path / 'store'}")
        return
    _, make_bucket = request.getfixturevalue("s3")
    make_bucket("lmf-contract")  # the server lives for the session: each test its own prefix
    store = open_store(f"s3://lmf-contract/runs/{uuid.uuid4().hex}", part_size=5 * MIB)
    yield store
    store.close()


def test_open_store_picks_the_implementation_and_keeps_the_uri(store, tmp_path):
    assert isinstance(store, LocalStore if store.uri.startswith("file://") else S3Store)
    assert store.uri == f"file://{tmp_path / 'store'}" or store.uri.startswith("s3://lmf-contract/runs/")
    assert store.join("a/b") == store.uri + "/a/b"
    assert isinstance(open_store(tmp_path), LocalStore) and open_store(tmp_path).uri == str(tmp_path)


def test_uploads_are_verified_and_transfers_round_trip(store, tmp_path):
    store.check()
    data = os.urandom(11 * MIB + 3)  # three parts on S3
    source = tmp_path / "big.bin"
    source.write_bytes(data)
    sent: list[int] = []
    assert store.upload_file(source, "ckpt/big.bin", progress=sent.append) == hashlib.sha256(data).hexdigest()
    assert sum(sent) == len(data)
    store.put_bytes("ckpt/small.json", b"{}")

    listing = store.listing("ckpt/")
    assert {rel: obj.size for rel, obj in listing.items()} == {"ckpt/big.bin": len(data), "ckpt/small.json": 2}
    assert all(-5 < obj.age_seconds < 60 for obj in listing.values())
    assert store.list("ckpt") == ["ckpt/big.bin", "ckpt/small.json"]
    assert store.get_bytes("ckpt/small.json") == b"{}" and store.get_bytes("ckpt/none.json") is None
    assert store.open_uploads("ckpt/") == []

    target = tmp_path / "copy.bin"
    got: list[int] = []
    store.download("ckpt/big.bin", target, progress=got.append)
    assert target.read_bytes() == data and sum(got) == len(data)
    with pytest.raises(ObjectMissing, match="ckpt/none.bin"):
        store.download("ckpt/none.bin", tmp_path / "none.bin")

    store.delete(["ckpt/big.bin", "ckpt/never-there.bin"])
    assert store.list("ckpt") == ["ckpt/small.json"]


def test_ranged_reads_say_the_size_and_stop_at_the_end(store):
    store.write_bytes("shard.bin", bytes(range(100)))
    assert store.read_range("shard.bin", 10, 5) == bytes(range(10, 15))
    assert store.read_range_sized("shard.bin", 90, 20) == (bytes(range(90, 100)), 100)
    assert store.read_range_sized("shard.bin", 150, 10) == (b"", 100)  # S3: InvalidRange, answered by a HEAD
    with pytest.raises(ObjectMissing, match="cannot read .*missing.bin"):
        store.read_range_sized("missing.bin", 0, 10)
    with store.open_read("shard.bin") as fh:
        fh.seek(50)
        assert fh.read(3) == bytes([50, 51, 52])


def test_a_cancelled_upload_leaves_nothing_and_open_uploads_can_be_aborted(store, tmp_path):
    source = tmp_path / "part.bin"
    source.write_bytes(os.urandom(12 * MIB))
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        store.upload_file(source, "ckpt/part.bin", cancel)
    assert store.listing("ckpt/") == {} and store.open_uploads("ckpt/") == []

    # A writer that died mid-upload leaves an open upload that the store lists and aborts.
    if isinstance(store, LocalStore):
        (store.root / "ckpt").mkdir(parents=True, exist_ok=True)
        (store.root / "ckpt" / ".tmp-part.bin.dead").write_bytes(b"half")
    else:
        store.objects.client.create_multipart_upload(Bucket=store.bucket, Key=store.prefix + "ckpt/part.bin")
    (upload,) = store.open_uploads("ckpt/")
    assert upload.key.startswith("ckpt/") and upload.age_seconds > -5  # moto dates every upload 2010
    assert store.listing("ckpt/") == {}  # never taken for a file
    store.abort_upload(upload)
    assert store.open_uploads("ckpt/") == []


def test_reads_by_path_raise_storage_errors_that_say_what_is_missing(store):
    with pytest.raises(ObjectMissing, match=r"cannot read .*/nothing\.json"):
        store.read_bytes("nothing.json")
    assert not store.exists("nothing.json")


def test_failure_maps_the_stores_own_errors_and_leaves_others_alone(store):
    if isinstance(store, LocalStore):
        missing, denied = FileNotFoundError(2, "No such file"), PermissionError(13, "Permission denied")
    else:
        missing = ClientError({"Error": {"Code": "NoSuchBucket", "Message": "gone"}}, "GetObject")
        denied = ClientError({"Error": {"Code": "InvalidAccessKeyId", "Message": "who?"}}, "GetObject")
    assert isinstance(store.failure(missing, "download", "a.bin"), ObjectMissing)
    refused = store.failure(denied, "download", "a.bin")
    assert isinstance(refused, AccessDenied) and str(refused).startswith("cannot download ")
    assert type(store.failure(StorageError("short read"), "read", "a.bin")) is StorageError
    assert store.failure(Cancelled("a.bin"), "download", "a.bin") is None
    assert store.failure(ValueError("a bug"), "download", "a.bin") is None


def test_check_says_why_a_store_cannot_be_used(s3, tmp_path):
    with pytest.raises(StorageError, match="bucket 'lmf-no-such-bucket' does not exist"):
        open_store("s3://lmf-no-such-bucket/x").check()
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(StorageError, match="cannot create the directory"):
        open_store(f"file://{tmp_path / 'file' / 'store'}").check()
