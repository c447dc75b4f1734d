"""The trainer reads a split through its index (lmforge.common.shard_index): a local output
memory-mapped (ShardSource), an s3:// one streamed from moto (StreamingSource) with each shard's
block sidecar fetched at its first read. A rank never reads the other split's index, a version-1
manifest still reads, and a corrupt index or sidecar is one line of ShardFormatError."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from lmforge.common.errors import ShardFormatError
from lmforge.common.s3 import S3Bucket
from lmforge.common.shard_index import read_split_index
from lmforge.trainer import data_stream
from lmforge.trainer.block_cache import BlockCache
from lmforge.trainer.data import ShardSource
from lmforge.trainer.data_stream import StreamingSource
from tests.s3_server import make_bucket, upload_tree
from tests.trainer.helpers import random_output

SEQ = 32
BLOCK = 4096  # the 20,000-token train shards are 11 blocks each
BUCKET = "lmf-index"


def upload(client, root, prefix: str) -> None:
    upload_tree(client, BUCKET, root, prefix)


@pytest.fixture(scope="module")
def prepared(s3_endpoint, tmp_path_factory):
    """A data-prep-format output (two train shards, one val shard) on disk and at s3://lmf-index/prep."""
    root = random_output(tmp_path_factory.mktemp("index") / "prepared", block_bytes=BLOCK)
    client = make_bucket(s3_endpoint, BUCKET)
    upload(client, root, "prep")
    return root, client


def whole_object_gets(monkeypatch) -> list[str]:
    """The key of every whole-object GET (manifest, indexes, sidecars) S3Bucket makes from now on."""
    keys: list[str] = []
    original = S3Bucket.get_bytes

    def counted(self, key):
        keys.append(key)
        return original(self, key)

    monkeypatch.setattr(S3Bucket, "get_bytes", counted)
    return keys


def one_line(excinfo) -> str:
    assert "\n" not in str(excinfo.value)
    return str(excinfo.value)


def test_a_split_is_read_through_its_index_and_each_sidecar_with_its_first_block(s3, prepared, tmp_path,
                                                                                monkeypatch):
    root, _ = prepared
    gets = whole_object_gets(monkeypatch)
    streamed = StreamingSource(f"s3://{BUCKET}/prep", "train", SEQ, BlockCache(tmp_path / "cache", 1 << 20))
    assert gets == ["prep/manifest.json", "prep/index/train.index"]  # opening: the manifest and one index
    local = ShardSource(root, "train", SEQ)
    assert [s.path.name for s in local.shards] == ["train_00000.bin", "train_00001.bin"]
    assert streamed.num_sequences == local.num_sequences == 2 * ((20_000 - 1) // SEQ)
    first_of_second = int(local._ends[0])
    for index in range(0, first_of_second, 37):
        assert streamed.sequence(index).tobytes() == local.sequence(index).tobytes()
    assert gets[2:] == ["prep/shards/train_00000.blocks"]  # the second shard's sidecar not yet fetched
    for index in range(first_of_second, local.num_sequences, 41):
        assert streamed.sequence(index).tobytes() == local.sequence(index).tobytes()
    assert gets[2:] == ["prep/shards/train_00000.blocks", "prep/shards/train_00001.blocks"]  # once each


def test_a_rank_reading_one_split_never_reads_the_other_splits_index(s3, prepared, tmp_path, monkeypatch):
    root, _ = prepared
    gets = whole_object_gets(monkeypatch)
    val = StreamingSource(f"s3://{BUCKET}/prep", "val", SEQ, BlockCache(tmp_path / "cache", 1 << 20))
    val.sequence(0)
    assert gets == ["prep/manifest.json", "prep/index/val.index", "prep/shards/val_00000.blocks"]
    alone = tmp_path / "val-alone"  # the train split's index (and shards) gone: val still opens
    shutil.copytree(root, alone)
    (alone / "index" / "train.index").unlink()
    assert ShardSource(alone, "val", SEQ).num_sequences == val.num_sequences
    with pytest.raises(ShardFormatError) as excinfo:
        ShardSource(alone, "train", SEQ)
    assert one_line(excinfo) == f"{alone}/index/train.index: listed in manifest.json but missing"


def version_1_copy(root, target) -> None:
    """`root` as data prep wrote it before split indexes: every shard in manifest.json with its block
    hashes; no index/ and no sidecars, so reading either would fail."""
    shutil.copytree(root, target)
    manifest = json.loads((root / "manifest.json").read_text())
    shards = []
    for split in manifest["splits"]:
        for entry in read_split_index(manifest, split, lambda rel: (root / rel).read_bytes(), str(root)):
            raw = (root / entry.path).read_bytes()
            shards.append({"path": entry.path, "split": split, "tokens": entry.tokens, "documents": entry.documents,
                           "sha256": entry.sha256, "block_bytes": entry.block_bytes,
                           "block_sha256": [hashlib.sha256(raw[i : i + entry.block_bytes]).hexdigest()
                                            for i in range(0, len(raw), entry.block_bytes)]})
            (target / entry.sidecar_path).unlink()
    shutil.rmtree(target / "index")
    older = {"format": "lmforge-shards", "version": 1, "dtype": manifest["dtype"], "shards": shards,
             "tokenizer": manifest["tokenizer"], "inputs": ["in.warc.wet.gz"]}
    (target / "manifest.json").write_text(json.dumps(older))


def test_a_version_1_manifest_still_reads_locally_and_streamed(s3, prepared, tmp_path, monkeypatch):
    root, client = prepared
    version_1_copy(root, tmp_path / "v1")
    upload(client, tmp_path / "v1", "v1")
    gets = whole_object_gets(monkeypatch)
    current = ShardSource(root, "train", SEQ)
    old_local = ShardSource(tmp_path / "v1", "train", SEQ)
    old_streamed = StreamingSource(f"s3://{BUCKET}/v1", "train", SEQ, BlockCache(tmp_path / "cache", 1 << 20))
    assert old_local.num_sequences == old_streamed.num_sequences == current.num_sequences
    for index in range(0, current.num_sequences, 53):
        want = current.sequence(index).tobytes()
        assert old_local.sequence(index).tobytes() == old_streamed.sequence(index).tobytes() == want
    assert gets == ["v1/manifest.json"]  # the block hashes came with it


@pytest.mark.parametrize(("change", "message"), [
    (lambda raw: raw[:100], "100 bytes whose sha256 is not the one manifest.json records for its 384"),
    (lambda raw: raw[:200] + bytes([raw[200] ^ 1]) + raw[201:], "384 bytes whose sha256 is not the one "),
])
def test_a_truncated_or_corrupt_index_is_one_line(s3, prepared, tmp_path, change, message):
    root, client = prepared
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    index = bad / "index" / "train.index"
    index.write_bytes(change(index.read_bytes()))
    upload(client, bad, "bad-index")
    with pytest.raises(ShardFormatError) as excinfo:
        ShardSource(bad, "train", SEQ)
    assert one_line(excinfo).startswith(f"{bad}/index/train.index: {message}")
    with pytest.raises(ShardFormatError) as excinfo:
        StreamingSource(f"s3://{BUCKET}/bad-index", "train", SEQ, BlockCache(tmp_path / "cache", 1 << 20))
    assert one_line(excinfo).startswith(f"s3://{BUCKET}/bad-index/index/train.index: {message}")


@pytest.mark.parametrize(("prefix", "change", "message"), [
    ("truncated-sidecar", lambda raw: raw[:-32], "320 bytes that are not the 11 block digests the split index"),
    ("corrupt-sidecar", lambda raw: raw[:40] + bytes([raw[40] ^ 1]) + raw[41:], "352 bytes that are not the 11"),
    ("missing-sidecar", None, "listed in the split index but missing"),
])
def test_a_bad_sidecar_fails_the_shards_first_read_and_caches_nothing_of_it(s3, prepared, tmp_path, prefix,
                                                                            change, message):
    root, client = prepared
    upload(client, root, prefix)
    key = f"{prefix}/shards/train_00001.blocks"
    if change is None:
        client.delete_object(Bucket=BUCKET, Key=key)
    else:
        client.put_object(Bucket=BUCKET, Key=key, Body=change((root / "shards" / "train_00001.blocks").read_bytes()))
    cache = BlockCache(tmp_path / "cache", 1 << 20)
    source = StreamingSource(f"s3://{BUCKET}/{prefix}", "train", SEQ, cache)  # sidecars are not read at open
    source.sequence(0)  # the first shard is intact
    cached = cache.cached_bytes()
    with pytest.raises(ShardFormatError) as excinfo:
        source.sequence(int(source._ends[0]))
    assert one_line(excinfo).startswith(f"s3://{BUCKET}/{key}: {message}")
    assert cache.cached_bytes() == cached  # no block of the shard was fetched


def test_the_sidecars_a_source_keeps_are_bounded(s3, prepared, tmp_path, monkeypatch):
    root, _ = prepared
    monkeypatch.setattr(data_stream, "SIDECARS_KEPT", 1)
    gets = whole_object_gets(monkeypatch)
    source = StreamingSource(f"s3://{BUCKET}/prep", "train", SEQ, BlockCache(tmp_path / "cache", 1 << 20))
    local = ShardSource(root, "train", SEQ)
    second = int(local._ends[0])
    for index in (0, 1, second, second + 1, 2, second + 2):  # shard 0, 0, 1, 1, 0, 1
        assert source.sequence(index).tobytes() == local.sequence(index).tobytes()
    assert [key.rsplit("/", 1)[1] for key in gets[2:]] == [
        "train_00000.blocks", "train_00001.blocks", "train_00000.blocks", "train_00001.blocks"]
    assert len(source._sidecars) == 1
