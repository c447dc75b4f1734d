"""s3:// data sources streamed from moto's S3 server (loopback HTTP) through the node's block cache."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from lmforge.common.errors import ConfigError, InputError, ShardFormatError
from lmforge.common.s3 import S3Bucket
from lmforge.common.shard_index import read_split_index, write_split_index
from lmforge.trainer.block_cache import BlockCache
from lmforge.trainer.data import ShardSource
from lmforge.trainer.data_stream import StreamingSource, open_sources, read_batch
from lmforge.trainer.sampling import BlockSampler
from tests.s3_server import make_bucket
from tests.s3_server import upload_tree as upload
from tests.trainer.helpers import random_output, read_metrics

SEQ = 32
BLOCK = 4096  # small manifest blocks: the 20,000-token train shards are 10 blocks each
BUCKET = "lmf-stream"


@pytest.fixture(scope="module")
def prepared(s3_endpoint, tmp_path_factory):
    """A data-prep output on disk and, unchanged, at s3://lmf-stream/prep."""
    root = random_output(tmp_path_factory.mktemp("stream") / "prepared", block_bytes=BLOCK)
    client = make_bucket(s3_endpoint, BUCKET)
    upload(client, BUCKET, root, "prep")
    return root, client


def cache_files(cache: BlockCache) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in cache.blocks_dir.glob("*/*")}


def test_streamed_batches_equal_local_ones_within_a_bounded_cache(s3, prepared, tmp_path, monkeypatch):
    root, _ = prepared
    fetched = []
    original = S3Bucket.get_range_sized

    def counted(self, key, start, length):
        fetched.append((key, start))
        return original(self, key, start, length)

    monkeypatch.setattr(S3Bucket, "get_range_sized", counted)
    cache = BlockCache(tmp_path / "cache", max_bytes=3 * BLOCK)  # the train shards are 20 blocks
    local = BlockSampler([ShardSource(root, "train", SEQ)], [1.0], seed=5)
    streamed = BlockSampler([StreamingSource(f"s3://{BUCKET}/prep", "train", SEQ, cache)], [1.0], seed=5)
    assert fetched == []  # opening reads the manifest only
    assert streamed.sources[0].num_sequences == local.sources[0].num_sequences

    for step in range(30):
        for rank in range(2):
            want, want_refs = local.batch(step, rank, 2, 4)
            got, got_refs = read_batch(streamed, step, rank, 2, 4)
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
            assert got_refs == want_refs
            files = cache_files(cache)
            assert sum(files.values()) <= 3 * BLOCK == cache.max_bytes
            assert cache.cached_bytes() == sum(files.values())
    assert len(fetched) > len(set(fetched)) >= 15  # blocks evicted and fetched again, still right
    assert not list(cache.tmp_dir.iterdir())


def _iterate_rank(cache_dir, endpoint, rank, steps, out):
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=endpoint, LMFORGE_S3_ANONYMOUS="0")
    cache = BlockCache(cache_dir, max_bytes=4 * BLOCK)
    sampler = BlockSampler([StreamingSource(f"s3://{BUCKET}/prep", "train", SEQ, cache)], [1.0], seed=5)
    batches = [read_batch(sampler, step, rank, 2, 4)[0] for step in range(steps)]
    np.save(out, np.stack(batches))


def test_two_processes_share_one_bounded_cache(s3, prepared, tmp_path):
    endpoint, _ = s3
    root, _ = prepared
    cache_dir = tmp_path / "cache"
    context = multiprocessing.get_context("spawn")
    ranks = [context.Process(target=_iterate_rank, args=(cache_dir, endpoint, r, 25, tmp_path / f"rank{r}.npy"))
             for r in range(2)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(120)
        assert process.exitcode == 0
    local = BlockSampler([ShardSource(root, "train", SEQ)], [1.0], seed=5)
    for rank in range(2):
        want = np.stack([local.batch(step, rank, 2, 4)[0] for step in range(25)])
        assert np.load(tmp_path / f"rank{rank}.npy").tobytes() == want.tobytes()
    cache = BlockCache(cache_dir, max_bytes=4 * BLOCK)
    files = cache_files(cache)
    assert 0 < sum(files.values()) <= 4 * BLOCK
    assert cache.cached_bytes() == sum(files.values())  # every block counted once, nothing left unindexed
    assert not list(cache.tmp_dir.iterdir())


def _open_cache_at(cache_dir, barrier, results):
    barrier.wait()  # every process opens the new cache at the same moment, as a node's ranks do
    try:
        BlockCache(cache_dir, 1 << 20)
        results.put("ok")
    except Exception as exc:  # noqa: BLE001 - the test reports whatever a process hit
        results.put(repr(exc))


def test_ranks_opening_a_new_cache_at_once_all_succeed(tmp_path):
    """SQLite answers a concurrent switch to WAL with 'database is locked' at once; the setup is
    serialized so no rank fails at start."""
    context = multiprocessing.get_context("spawn")
    for attempt in range(3):
        barrier, results = context.Barrier(4), context.Queue()
        processes = [context.Process(target=_open_cache_at, args=(tmp_path / f"cache-{attempt}", barrier, results))
                     for _ in range(4)]
        for process in processes:
            process.start()
        outcomes = [results.get(timeout=60) for _ in processes]
        for process in processes:
            process.join(timeout=60)
        assert outcomes == ["ok"] * 4, outcomes


def test_lru_eviction_and_a_dead_fill_recovered(tmp_path):
    cache = BlockCache(tmp_path, max_bytes=20)
    blocks = {name: name.encode() * 10 for name in ("a", "b", "c")}  # 10 bytes each
    fetches = []

    def fetch(name):
        return lambda: (fetches.append(name), blocks[name])[1]

    assert cache.read("a", 2, 3, fetch("a")) == b"aaa"
    assert cache.read("b", 0, 10, fetch("b")) == blocks["b"]
    assert cache.read("a", 0, 1, fetch("a")) == b"a"  # a hit: a is now the most recently used
    assert cache.read("c", 0, 2, fetch("c")) == b"cc"  # evicts b
    assert sorted(cache_files(cache)) == ["a", "c"] and fetches == ["a", "b", "c"]
    assert cache.read("b", 9, 1, fetch("b")) == b"b" and fetches[-1] == "b"
    cache.close()

    orphan = tmp_path / "blocks" / "d" / "d"  # renamed into blocks/ by a process killed before it indexed it
    orphan.parent.mkdir()
    orphan.write_bytes(b"d" * 10)
    reopened = BlockCache(tmp_path, max_bytes=20)
    assert reopened.cached_bytes() == sum(cache_files(reopened).values()) <= 20
    assert "d" not in cache_files(reopened)  # indexed as least recently used, so evicted first


def corrupt_copy(client, root, rel: str, prefix: str, change) -> None:
    raw = bytearray((root / rel).read_bytes())
    client.put_object(Bucket=BUCKET, Key=f"{prefix}/{rel}", Body=bytes(change(raw)))


def rehashed_copy(root, target, rel: str, data: bytes):
    """A copy of output `root` in which shard `rel` is `data`, its sidecar, its split's index and the
    manifest recording data's hashes."""
    shutil.copytree(root, target)
    (target / rel).write_bytes(data)
    manifest = json.loads((target / "manifest.json").read_text())
    split = rel.removeprefix("shards/").split("_")[0]
    entries = read_split_index(manifest, split, lambda name: (target / name).read_bytes(), str(target))
    old = next(e for e in entries if e.path == rel)
    sidecar = b"".join(hashlib.sha256(data[i : i + old.block_bytes]).digest()
                       for i in range(0, len(data), old.block_bytes))
    (target / old.sidecar_path).write_bytes(sidecar)
    new = dataclasses.replace(old, sha256=hashlib.sha256(data).hexdigest(),
                              blocks_sha256=hashlib.sha256(sidecar).hexdigest())
    manifest["splits"][split] = write_split_index(lambda name, raw: (target / name).write_bytes(raw), split,
                                                  [new if e is old else e for e in entries])
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target


def flip(offset):
    def change(raw):
        raw[offset] ^= 0xFF
        return raw
    return change


@pytest.mark.parametrize(("prefix", "change", "message"), [
    ("flipped-byte", flip(3 * BLOCK + 7), "bytes 12288-16383 do not match their recorded block sha256"),
    ("truncated", lambda raw: raw[:-2], "41022 bytes, the manifest's 20000 tokens make 41024"),
    ("other-tokenizer", flip(50), "written with another tokenizer"),
])
def test_a_bad_block_is_named_and_never_cached(s3, prepared, tmp_path, prefix, change, message):
    root, client = prepared
    upload(client, BUCKET, root, prefix)
    rel = "shards/train_00001.bin"
    corrupt_copy(client, root, rel, prefix, change)
    if prefix == "other-tokenizer":  # block 0's hash made right: the header check is what catches it
        changed = bytes(change(bytearray((root / rel).read_bytes())))
        upload(client, BUCKET, rehashed_copy(root, tmp_path / "rehashed", rel, changed), prefix)
    cache = BlockCache(tmp_path / "cache", max_bytes=1 << 20)
    source = StreamingSource(f"s3://{BUCKET}/{prefix}", "train", SEQ, cache)
    first = source.shards[0].sequences
    source.sequence(0)  # the first shard is intact
    bad_sequence = first + (3 * BLOCK - 1024) // (SEQ * 2) + 1  # inside block 3 of the second shard
    with pytest.raises(ShardFormatError, match=f"s3://{BUCKET}/{prefix}/{rel}: .*{message}"):
        source.sequence(bad_sequence)
    cached = cache_files(cache)
    assert not list(cache.tmp_dir.iterdir())
    assert cache.cached_bytes() == sum(cached.values())
    assert all(hashlib.sha256((cache.blocks_dir / n[:2] / n).read_bytes()).hexdigest() == n for n in cached)


def test_an_older_manifest_streams_each_shard_as_one_block(s3, prepared, tmp_path):
    root, client = prepared
    manifest = json.loads((root / "manifest.json").read_text())
    older = {"tokenizer": manifest["tokenizer"],  # before block hashes: each shard's path, split, tokens, sha256
             "shards": [{"path": e.path, "split": split, "tokens": e.tokens, "sha256": e.sha256}
                        for split in ("train", "val")
                        for e in read_split_index(manifest, split, lambda rel: (root / rel).read_bytes(), "")]}
    upload(client, BUCKET, root, "old")
    client.put_object(Bucket=BUCKET, Key="old/manifest.json", Body=json.dumps(older).encode())
    cache = BlockCache(tmp_path / "cache", max_bytes=1 << 20)
    source = StreamingSource(f"s3://{BUCKET}/old", "train", SEQ, cache)
    local = ShardSource(root, "train", SEQ)
    for index in (0, 7, local.num_sequences - 1):
        assert source.sequence(index).tobytes() == local.sequence(index).tobytes()
    assert sorted(cache_files(cache).values()) == [41024, 41024]  # the two shards, whole
    with pytest.raises(ConfigError, match="smaller than one block"):
        StreamingSource(f"s3://{BUCKET}/old", "train", SEQ, BlockCache(tmp_path / "small", max_bytes=BLOCK))


def test_sources_that_cannot_stream_are_config_or_input_errors(s3, prepared, tmp_path):
    root, _ = prepared
    cache = BlockCache(tmp_path / "cache", max_bytes=1 << 20)
    with pytest.raises(InputError, match=f"no s3://{BUCKET}/elsewhere/manifest.json"):
        StreamingSource(f"s3://{BUCKET}/elsewhere", "train", SEQ, cache)
    with pytest.raises(InputError, match="no s3://lmf-no-such-bucket/prep/manifest.json"):
        StreamingSource("s3://lmf-no-such-bucket/prep", "train", SEQ, cache)
    with pytest.raises(ConfigError, match="neither a local path nor an s3:// URI"):
        open_sources(["https://example.com/data"], ["data"], "train", SEQ, cache=cache, verify_sha256=True)
    local, streamed = open_sources([str(root), f"s3://{BUCKET}/prep"], ["a", "b"], "val", SEQ, cache=cache,
                                   verify_sha256=True)
    assert isinstance(local, ShardSource) and isinstance(streamed, StreamingSource)
    assert local.num_sequences == streamed.num_sequences


@pytest.mark.slow
def test_two_ranks_train_streaming_from_s3(s3, prepared, tmp_path):
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "lmforge.trainer", f"data.sources=[{{path: 's3://{BUCKET}/prep'}}]", "data.seq_len=16",
               f"data.cache_bytes={6 * BLOCK}", "parallel.mode=ddp", "steps=3", "eval_every=2", f"run_dir={run_dir}",
               "model.overrides={n_layer: 1, n_head: 2, n_embd: 32, context_length: 16}"]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1, 2]
    assert [r["step"] for r in read_metrics(run_dir, "eval")] == [1, 2]
    blocks = list((run_dir / "data-cache" / "blocks").glob("*/*"))
    assert blocks and sum(p.stat().st_size for p in blocks) <= 6 * BLOCK
