"""Data sources synced from S3 (moto's S3 server over loopback HTTP) into a local cache."""

from __future__ import annotations

import numpy as np
import pytest

from lmforge.common.errors import ConfigError, ShardFormatError
from lmforge.trainer.data import ShardSource
from lmforge.trainer.data_sync import local_source_path, sync_source, sync_sources
from tests.trainer.helpers import random_output


def upload(client, bucket: str, root, prefix: str) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(root).as_posix()}")


def file_stats(root) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of every file: a re-download (temp + rename) changes the inode."""
    return {p.relative_to(root).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_sync_from_s3_matches_original_and_is_reused(s3, tmp_path):
    _, make_bucket = s3
    client = make_bucket("lmf-sync")
    original = random_output(tmp_path / "prepared")
    upload(client, "lmf-sync", original, "runs/prep1")
    cache = tmp_path / "cache"
    barriers = []

    [synced] = sync_sources(["s3://lmf-sync/runs/prep1/"], cache, local_rank=0, barrier=lambda: barriers.append(1))
    assert synced == cache / "lmf-sync" / "runs" / "prep1" == local_source_path("s3://lmf-sync/runs/prep1", cache)
    assert barriers == [1]
    assert file_stats(synced).keys() == file_stats(original).keys()  # manifest, tokenizer, .bin and .idx
    want, got = ShardSource(original, "train", 32), ShardSource(synced, "train", 32)
    assert got.num_sequences == want.num_sequences
    for i in range(want.num_sequences):
        np.testing.assert_array_equal(got.sequence(i), want.sequence(i))
    assert ShardSource(synced, "val", 32).num_sequences == ShardSource(original, "val", 32).num_sequences

    before = file_stats(synced)
    assert sync_source("s3://lmf-sync/runs/prep1", cache) == synced
    assert file_stats(synced) == before  # nothing downloaded, nothing rewritten

    # A pod killed mid-sync: no manifest yet, one shard missing, one corrupted in place.
    (synced / "manifest.json").unlink()
    (synced / "shards/train_00000.bin").unlink()
    damaged = synced / "shards/val_00000.bin"
    raw = bytearray(damaged.read_bytes())
    raw[-1] ^= 0xFF
    damaged.write_bytes(bytes(raw))
    before = file_stats(synced)
    sync_source("s3://lmf-sync/runs/prep1", cache)
    after = file_stats(synced)
    changed = {rel for rel in after if after[rel] != before.get(rel)}
    assert changed == {"manifest.json", "shards/train_00000.bin", "shards/val_00000.bin"}
    ShardSource(synced, "val", 32)  # verifies sha256 again


def test_corrupt_object_in_bucket_is_named_and_leaves_no_manifest(s3, tmp_path):
    _, make_bucket = s3
    client = make_bucket("lmf-corrupt")
    original = random_output(tmp_path / "prepared")
    upload(client, "lmf-corrupt", original, "prep")
    shard = original / "shards/train_00001.bin"
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 0xFF  # same size, different bytes
    client.put_object(Bucket="lmf-corrupt", Key="prep/shards/train_00001.bin", Body=bytes(raw))
    cache = tmp_path / "cache"

    with pytest.raises(ShardFormatError, match="s3://lmf-corrupt/prep/shards/train_00001.bin"):
        sync_source("s3://lmf-corrupt/prep", cache, verify_sha256=False)  # downloads are always checked
    synced = cache / "lmf-corrupt" / "prep"
    assert not (synced / "manifest.json").exists()
    assert not (synced / "shards/train_00001.bin").exists()
    assert not list(synced.rglob(".tmp-*"))
    with pytest.raises(ConfigError, match="no manifest.json"):
        ShardSource(synced, "train", 32)


def test_missing_manifest_is_a_config_error(s3, tmp_path):
    _, make_bucket = s3
    client = make_bucket("lmf-nomanifest")
    original = random_output(tmp_path / "prepared")
    upload(client, "lmf-nomanifest", original, "prep")
    client.delete_object(Bucket="lmf-nomanifest", Key="prep/manifest.json")
    with pytest.raises(ConfigError, match="s3://lmf-nomanifest/prep"):
        sync_source("s3://lmf-nomanifest/prep", tmp_path / "cache")
    with pytest.raises(ConfigError, match="s3://lmf-nomanifest/elsewhere"):
        sync_source("s3://lmf-nomanifest/elsewhere", tmp_path / "cache")


def test_local_paths_pass_through_and_only_local_rank_0_downloads(s3, tmp_path):
    _, make_bucket = s3
    client = make_bucket("lmf-ranks")
    original = random_output(tmp_path / "prepared")
    upload(client, "lmf-ranks", original, "prep")
    cache = tmp_path / "cache"
    assert sync_source(str(original), cache) == original
    assert sync_source(f"file://{original}", cache) == original

    barriers = []
    paths = sync_sources([str(original), "s3://lmf-ranks/prep"], cache, local_rank=1,
                         barrier=lambda: barriers.append(1))
    assert paths == [original, cache / "lmf-ranks" / "prep"]
    assert barriers == [1]
    assert not cache.exists()  # local rank 1 waits for rank 0 and downloads nothing
    with pytest.raises(ConfigError, match="neither a local path nor an s3:// URI"):
        local_source_path("https://example.com/data", cache)


@pytest.mark.slow
def test_two_ranks_train_from_an_s3_source(s3, tmp_path):
    import os
    import subprocess
    import sys

    from tests.trainer.helpers import read_metrics

    _, make_bucket = s3
    upload(make_bucket("lmf-train"), "lmf-train", random_output(tmp_path / "prepared"), "prep")
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "lmforge.trainer", "data.sources=[{path: 's3://lmf-train/prep'}]", "data.seq_len=16",
               "parallel.mode=ddp", "steps=3", f"run_dir={run_dir}",
               "model.overrides={n_layer: 1, n_head: 2, n_embd: 32, context_length: 16}"]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1, 2]
    assert (run_dir / "data-cache" / "lmf-train" / "prep" / "manifest.json").exists()
