"""The training data loader: manifest validation, determinism, epochs, mixtures."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from lmforge.common.errors import ConfigError, InputError, ShardFormatError
from lmforge.common.shards import write_shard
from lmforge.trainer.data import ShardSource
from lmforge.trainer.sampling import BlockSampler, GlobalSampler, KeyedPermutation

SEQ = 8


def make_output(root: Path, shard_sizes: list[int], *, tokenizer_sha: str = "ab" * 32, base: int = 0,
                split: str = "train") -> Path:
    """A data-prep-shaped output: shards in the real format and a manifest listing them."""
    entries = []
    for k, size in enumerate(shard_sizes):
        tokens = (np.arange(size) + base + 1000 * k) % 60000
        rel = f"shards/{split}_{k:05d}.bin"
        (root / "shards").mkdir(parents=True, exist_ok=True)
        digest = write_shard(root / rel, tokens, np.array([size]), eot_id=0, vocab_size=65536,
                             tokenizer_sha256=tokenizer_sha)
        entries.append({"path": rel, "split": split, "tokens": size, "sha256": digest.sha256})
    manifest = {"shards": entries, "tokenizer": {"sha256": tokenizer_sha, "vocab_size": 65536}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


@pytest.mark.parametrize("n", [1, 2, 7, 100, 1000, 4097])
def test_keyed_permutation_is_a_bijection(n):
    perm = KeyedPermutation(n, key=42)
    assert sorted(perm(i) for i in range(n)) == list(range(n))


def test_keyed_permutation_depends_on_the_key():
    a, b = KeyedPermutation(1000, 1), KeyedPermutation(1000, 2)
    assert [a(i) for i in range(50)] != [b(i) for i in range(50)]
    assert [a(i) for i in range(50)] == [KeyedPermutation(1000, 1)(i) for i in range(50)]


def test_sequences_are_shard_slices(tmp_path):
    source = ShardSource(make_output(tmp_path, [41, 25]), "train", SEQ)
    assert source.num_sequences == 5 + 3
    assert source.sequence(0).tolist() == list(range(0, 9))
    assert source.sequence(4).tolist() == list(range(32, 41))
    assert source.sequence(5).tolist() == list(range(1000, 1009))  # first sequence of shard 1


def test_batches_are_a_pure_function_of_seed_step_rank(tmp_path):
    out = make_output(tmp_path, [4001])
    a = GlobalSampler([ShardSource(out, "train", SEQ)], [1.0], seed=7)
    b = GlobalSampler([ShardSource(out, "train", SEQ)], [1.0], seed=7)
    for step in (0, 3, 1000):
        assert np.array_equal(a.batch(step, 1, 2, 4)[0], b.batch(step, 1, 2, 4)[0])
    c = GlobalSampler([ShardSource(out, "train", SEQ)], [1.0], seed=8)
    assert not np.array_equal(a.batch(0, 0, 1, 4)[0], c.batch(0, 0, 1, 4)[0])


def test_global_batch_is_the_same_whatever_the_world_size(tmp_path):
    sampler = GlobalSampler([ShardSource(make_output(tmp_path, [4001]), "train", SEQ)], [1.0], seed=1)
    for step in (0, 5):
        one_rank = sampler.batch(step, 0, 1, 8)[0]
        two_ranks = np.concatenate([sampler.batch(step, r, 2, 4)[0] for r in (0, 1)])
        four_ranks = np.concatenate([sampler.batch(step, r, 4, 2)[0] for r in range(4)])
        assert np.array_equal(one_rank, two_ranks) and np.array_equal(one_rank, four_ranks)


def test_an_epoch_visits_every_sequence_once_then_reshuffles(tmp_path):
    source = ShardSource(make_output(tmp_path, [8 * 50 + 1]), "train", SEQ)
    sampler = GlobalSampler([source], [1.0], seed=3)
    first = [sampler.sample(q) for q in range(50)]
    second = [sampler.sample(q) for q in range(50, 100)]
    assert sorted(r.sequence for r in first) == list(range(50)) == sorted(r.sequence for r in second)
    assert [r.sequence for r in first] != [r.sequence for r in second]
    assert {r.epoch for r in first} == {0} and {r.epoch for r in second} == {1}


def test_mixture_proportions_follow_the_weights(tmp_path):
    web = ShardSource(make_output(tmp_path / "web", [8 * 500 + 1]), "train", SEQ, name="web")
    code = ShardSource(make_output(tmp_path / "code", [8 * 20 + 1], base=7), "train", SEQ, name="code")
    sampler = GlobalSampler([web, code], [7, 3], seed=0)
    counts = Counter(r.source for q in range(0, 20000, 8) for r in sampler.batch_refs(q // 8, 0, 1, 8))
    assert counts[1] / sum(counts.values()) == pytest.approx(0.3, abs=0.02)
    assert max(sampler.sample(q).epoch for q in range(20000) if sampler.sample(q).source == 1) > 10


def test_corrupt_truncated_or_foreign_shards_are_rejected(tmp_path):
    out = make_output(tmp_path, [401])
    shard = out / "shards" / "train_00000.bin"
    raw = bytearray(shard.read_bytes())
    raw[-2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(ShardFormatError, match="sha256"):
        ShardSource(out, "train", SEQ)
    ShardSource(out, "train", SEQ, verify_sha256=False)  # the cheap checks still pass
    shard.write_bytes(bytes(raw[:-10]))
    with pytest.raises(ShardFormatError, match="truncated"):
        ShardSource(out, "train", SEQ, verify_sha256=False)
    shard.write_bytes(b"GPT2" + bytes(raw[4:]))
    with pytest.raises(ShardFormatError, match="not an lmforge shard"):
        ShardSource(out, "train", SEQ, verify_sha256=False)
    shard.unlink()
    with pytest.raises(ShardFormatError, match="missing"):
        ShardSource(out, "train", SEQ)


def test_manifest_and_header_must_agree(tmp_path):
    out = make_output(tmp_path, [401])
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"][0]["tokens"] = 400
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardFormatError, match="header says 401 tokens"):
        ShardSource(out, "train", SEQ)
    manifest["shards"][0]["tokens"] = 401
    manifest["tokenizer"]["sha256"] = "cd" * 32
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardFormatError, match="another tokenizer"):
        ShardSource(out, "train", SEQ)


def test_a_missing_source_is_unusable_input(tmp_path):
    with pytest.raises(InputError, match="no manifest.json"):
        ShardSource(tmp_path, "train", SEQ)
    with pytest.raises(InputError, match=f"{tmp_path / 'nope'}: no such directory"):
        ShardSource(tmp_path / "nope", "train", SEQ)


def test_bad_sources_and_mixtures_are_config_errors(tmp_path):
    out = make_output(tmp_path / "a", [401])
    with pytest.raises(ConfigError, match="no 'val' shards"):
        ShardSource(out, "val", SEQ)
    other = make_output(tmp_path / "b", [401], tokenizer_sha="ef" * 32)
    with pytest.raises(ConfigError, match="different tokenizers"):
        GlobalSampler([ShardSource(out, "train", SEQ), ShardSource(other, "train", SEQ)], [1, 1], 0)
    with pytest.raises(ConfigError, match="weight"):
        GlobalSampler([ShardSource(out, "train", SEQ)], [1, 1], 0)


def test_reads_a_real_data_prep_output(tmp_path):
    from tokenizers import Tokenizer

    from lmforge.dataprep import cli
    from lmforge.sample_data.wet import write_sample_wet

    write_sample_wet(tmp_path / "in.warc.wet.gz", 200, 4)
    out = tmp_path / "prep"
    assert cli.main(["run", "--input", str(tmp_path / "in.warc.wet.gz"), "--output", str(out), "--workers", "1",
                     "--set", "tokenizer.vocab_size=600", "--set", "shards.val_fraction=0.1"]) == 0
    train, val = ShardSource(out, "train", 64), ShardSource(out, "val", 64)
    assert train.num_sequences > val.num_sequences > 0
    tokens, _ = BlockSampler([train], [1.0], seed=0).batch(0, 0, 1, 2)
    assert tokens.shape == (2, 65)
    text = Tokenizer.from_file(str(out / "tokenizer.json")).decode(tokens[0].tolist())
    assert len(text.split()) > 10
