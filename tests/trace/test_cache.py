"""fetch_index: a local index is used in place; an s3:// one is downloaded once into the cache (every file
checked against index.json), reused while index.json is the same, replaced (and the old copy deleted) when
it changes; a corrupt file refuses the index in one line and leaves nothing that looks complete."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from lmforge.common.errors import InputError
from lmforge.trace.cache import fetch_index
from lmforge.trace.format import ENTRY, INDEX_JSON, PARTITION_FILES, TOKENIZER, index_json, partition_dir
from tests.s3_server import upload_tree


def write_index(root: Path, partitions: int = 2, salt: bytes = b"") -> dict:
    """An index directory whose files are arbitrary bytes (the cache checks files, it does not read them),
    with an index.json that records them as the data-prep report writes it."""
    tokenizer = root / TOKENIZER
    root.mkdir(parents=True)
    tokenizer.write_text('{"model": "a tokenizer"}')
    entries = []
    for p in range(partitions):
        directory = root / partition_dir(p)
        directory.mkdir()
        files = {}
        for i, name in enumerate(PARTITION_FILES):
            data = salt + bytes([p, i]) * (100 * (i + 1))
            (directory / name).write_bytes(data)
            files[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        entry = {"name": partition_dir(p), "tokens": 100, "documents": 3, "files": files}
        (directory / ENTRY).write_text(json.dumps(entry))
        entries.append(entry)
    info = index_json(entries, vocab_size=320, eos_token_id=0,
                      tokenizer_sha256=hashlib.sha256(tokenizer.read_bytes()).hexdigest())
    (root / INDEX_JSON).write_text(json.dumps(info))
    return info


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def uploaded_index(s3, tmp_path: Path):
    """A two-partition index uploaded to s3://data/run/trace-index; returns the bucket's client."""
    _, make_bucket = s3
    client = make_bucket("data")
    write_index(tmp_path / "v1")
    upload_tree(client, "data", tmp_path / "v1", "run/trace-index")
    return client


def test_a_local_index_is_used_in_place(tmp_path):
    write_index(tmp_path / "index")
    assert fetch_index(str(tmp_path / "index"), tmp_path / "cache") == tmp_path / "index"
    assert fetch_index(f"file://{tmp_path / 'index'}", tmp_path / "cache") == tmp_path / "index"
    assert not (tmp_path / "cache").exists()
    with pytest.raises(InputError, match="not a trace index"):
        fetch_index(str(tmp_path), tmp_path / "cache")


def test_an_s3_index_is_downloaded_once_verified_and_replaced_by_a_new_version(s3, tmp_path):
    client = uploaded_index(s3, tmp_path)
    cache = tmp_path / "cache"

    local = fetch_index("s3://data/run/trace-index", cache)
    assert tree(local) == tree(tmp_path / "v1")  # every file, byte for byte
    assert [p.name for p in cache.iterdir() if p.is_dir()] == [local.name]
    stamp = (local / partition_dir(0) / "table.0").stat().st_mtime_ns

    client.delete_object(Bucket="data", Key="run/trace-index/partition-000001/table.0")
    assert fetch_index("s3://data/run/trace-index/", cache) == local  # reused: nothing downloaded again
    assert (local / partition_dir(0) / "table.0").stat().st_mtime_ns == stamp

    write_index(tmp_path / "v2", partitions=1, salt=b"v2")
    for key in [o["Key"] for o in client.list_objects_v2(Bucket="data")["Contents"]]:
        client.delete_object(Bucket="data", Key=key)
    upload_tree(client, "data", tmp_path / "v2", "run/trace-index")
    newer = fetch_index("s3://data/run/trace-index", cache)
    assert newer != local and tree(newer) == tree(tmp_path / "v2")
    assert [p.name for p in cache.iterdir() if p.is_dir()] == [newer.name]  # the old version is gone


def test_a_version_another_process_is_downloading_is_left_alone(s3, tmp_path):
    import fcntl

    uploaded_index(s3, tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir()
    busy, idle = cache / "trace-index-00000000000000aa.partial", cache / "trace-index-00000000000000bb.partial"
    for partial in (busy, idle):
        (partial / "partition-000000").mkdir(parents=True)
        (partial / "partition-000000" / "table.0").write_bytes(b"half")
    with open(cache / "trace-index-00000000000000aa.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # the other server, downloading that version
        local = fetch_index("s3://data/run/trace-index", cache)
    assert (busy / "partition-000000" / "table.0").read_bytes() == b"half" and not idle.exists()
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == sorted([local.name, busy.name])


def test_a_corrupt_file_refuses_the_index_and_nothing_looks_complete(s3, tmp_path):
    _, make_bucket = s3
    client = make_bucket("corrupt")
    write_index(tmp_path / "index")
    table = tmp_path / "index" / partition_dir(1) / "table.0"
    table.write_bytes(bytes(b ^ 1 for b in table.read_bytes()))  # same size, other bytes
    upload_tree(client, "corrupt", tmp_path / "index", "trace-index")
    cache = tmp_path / "cache"

    with pytest.raises(InputError) as refused:
        fetch_index("s3://corrupt/trace-index", cache)
    message = str(refused.value)
    assert "\n" not in message
    assert message == ("s3://corrupt/trace-index/partition-000001/table.0: sha256 does not match index.json "
                       "(corrupt or replaced); refusing the index")
    (partial,) = [p for p in cache.iterdir() if p.is_dir()]
    assert partial.name.endswith(".partial") and not (partial / INDEX_JSON).exists()
    assert not (partial / partition_dir(1) / "table.0").exists()

    # The file fixed in the bucket: the download resumes from the verified files and completes.
    kept = (partial / partition_dir(0) / "table.0").stat().st_mtime_ns
    write_index(tmp_path / "fixed")
    client.upload_file(str(tmp_path / "fixed" / partition_dir(1) / "table.0"), "corrupt",
                       "trace-index/partition-000001/table.0")
    local = fetch_index("s3://corrupt/trace-index", cache)
    assert tree(local) == tree(tmp_path / "fixed")
    assert (local / partition_dir(0) / "table.0").stat().st_mtime_ns == kept
    assert [p.name for p in cache.iterdir() if p.is_dir()] == [local.name]


def test_a_missing_index_and_a_stale_entry_are_one_line_errors(s3, tmp_path):
    _, make_bucket = s3
    client = make_bucket("stale")
    with pytest.raises(InputError, match=r"^s3://stale/nothing/index.json: missing \(not a trace index\)$"):
        fetch_index("s3://stale/nothing", tmp_path / "cache")
    write_index(tmp_path / "index")
    entry = tmp_path / "index" / partition_dir(0) / ENTRY
    entry.write_text(json.dumps({**json.loads(entry.read_text()), "tokens": 99}))
    upload_tree(client, "stale", tmp_path / "index", "trace-index")
    with pytest.raises(InputError, match=r"partition-000000/entry.json: differs from the partition's entry"):
        fetch_index("s3://stale/trace-index", tmp_path / "cache")
