"""The block-window sampler: a pure function of (seed, step, position), the same global batch on
any world size, every sequence once per epoch, exact mixture quotas, windows of at most W units,
and bounded read amplification through the real StreamingSource and block cache."""

from __future__ import annotations

from collections import Counter, defaultdict
from fractions import Fraction

import numpy as np
import pytest

from lmforge.common.errors import ConfigError
from lmforge.common.s3 import S3Bucket
from lmforge.trainer.block_cache import BlockCache
from lmforge.trainer.data import ShardSource
from lmforge.trainer.data_stream import StreamingSource, read_batch
from lmforge.trainer.prefetch import Prefetcher
from lmforge.trainer.sampling import BlockSampler, GlobalSampler, KeyedPermutation, keyed_order
from tests.trainer.helpers import write_output

SEQ = 8
BLOCK = 256  # bytes: 16 sequences of 8 two-byte tokens a block


def make_source(root, shard_sequences: list[int], *, seed: int = 0, name: str = "") -> ShardSource:
    """A source whose shards hold the given numbers of sequences (uneven, so units at shard ends are short)."""
    rng = np.random.default_rng(seed)
    shards = [rng.integers(1, 60_000, n * SEQ + 1, dtype=np.uint16) for n in shard_sequences]
    write_output(root, {"train": shards}, vocab_size=65_536, block_bytes=BLOCK)
    return ShardSource(root, "train", SEQ, name=name or root.name)


def unit_of(sampler: BlockSampler, ref) -> int:
    """The unit (index into the source's units) that holds a sampled sequence."""
    order = sampler.orders[ref.source]
    return int(np.searchsorted(order.unit_starts, ref.sequence, side="right")) - 1


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_source(tmp_path_factory.mktemp("corpus"), [301, 250, 77, 420])


def test_keyed_order_is_a_permutation_that_depends_on_the_key():
    for n in (1, 2, 7, 1000):
        assert sorted(keyed_order(n, 5).tolist()) == list(range(n))
    assert keyed_order(1000, 1).tolist() != keyed_order(1000, 2).tolist()
    assert keyed_order(1000, 1).tolist() == keyed_order(1000, 1).tolist()
    assert sorted(KeyedPermutation(1000, 3)(i) for i in range(1000)) == list(range(1000))


def test_units_follow_the_storage_blocks(corpus):
    sampler = BlockSampler([corpus], [1.0], seed=0, unit_blocks=2)
    order = sampler.orders[0]
    assert corpus.block_bytes == BLOCK and corpus.token_bytes == 2
    assert order.unit_sequences == 2 * BLOCK // (SEQ * 2) == 32
    # shard by shard (301, 250, 77 and 420 sequences), never across a shard's end
    assert order.unit_sizes.tolist() == [32] * 9 + [13] + [32] * 7 + [26] + [32, 32, 13] + [32] * 13 + [4]
    assert order.unit_starts.tolist()[9:12] == [288, 301, 333]


def test_batches_are_a_pure_function_of_seed_step_and_position(corpus):
    a = BlockSampler([corpus], [1.0], seed=7, streams=3, window_blocks=4, unit_blocks=2)
    b = BlockSampler([corpus], [1.0], seed=7, streams=3, window_blocks=4, unit_blocks=2)
    late_first = b.batch_refs(900, 1, 2, 6)  # b sees the late step first: no state carries between calls
    assert [a.batch_refs(s, 1, 2, 6) for s in (0, 3)] == [b.batch_refs(s, 1, 2, 6) for s in (0, 3)]
    assert a.batch_refs(900, 1, 2, 6) == late_first
    assert np.array_equal(a.batch(4, 0, 2, 6)[0], b.batch(4, 0, 2, 6)[0])
    other_seed = BlockSampler([corpus], [1.0], seed=8, streams=3, window_blocks=4, unit_blocks=2)
    assert other_seed.batch_refs(0, 0, 1, 12) != a.batch_refs(0, 0, 1, 12)


def test_the_global_batch_is_the_same_on_1_2_and_4_ranks_and_with_micro_batches(tmp_path, corpus):
    code = make_source(tmp_path / "code", [90, 61], seed=1)
    settings = {"streams": 4, "window_blocks": 4, "unit_blocks": 2, "mixture_chunk": 8}
    sampler = BlockSampler([corpus, code], [3, 1], seed=1, **settings)
    accumulating = BlockSampler([corpus, code], [3, 1], seed=1, grad_accum=2, **settings)
    for step in (0, 1, 17, 250):
        one = sampler.batch_refs(step, 0, 1, 8)
        two = [ref for rank in range(2) for ref in sampler.batch_refs(step, rank, 2, 4)]
        four = [ref for rank in range(4) for ref in sampler.batch_refs(step, rank, 4, 2)]
        # batch index 2·step + micro: a rank's micro-batches hold its contiguous share of the step's positions
        one_by_two_micro = [ref for micro in (0, 1) for ref in accumulating.batch_refs(2 * step + micro, 0, 1, 4)]
        two_by_two_micro = [ref for rank in (0, 1) for micro in (0, 1)
                            for ref in accumulating.batch_refs(2 * step + micro, rank, 2, 2)]
        assert one == two == four == one_by_two_micro == two_by_two_micro
    tokens = np.concatenate([sampler.batch(5, rank, 4, 2)[0] for rank in range(4)])
    assert np.array_equal(tokens, sampler.batch(5, 0, 1, 8)[0])


def test_every_sequence_once_per_epoch_and_the_next_epoch_reshuffled(corpus):
    sampler = BlockSampler([corpus], [1.0], seed=3, streams=3, window_blocks=6, unit_blocks=2)
    n = corpus.num_sequences
    refs = [ref for step in range(2 * n // 9 + 8) for ref in sampler.batch_refs(step, 0, 1, 9)]
    for epoch in (0, 1):
        drawn = [r.sequence for r in refs if r.epoch == epoch]
        assert sorted(drawn) == list(range(n))  # each once: none repeated, none left out
    first, second = ([r.sequence for r in refs if r.epoch == e] for e in (0, 1))
    assert first != second


def test_a_stream_draws_each_window_from_at_most_w_units(corpus):
    """Two sequences a stream draws close together come from the same window of at most W units: grouping
    units whose draws overlap in time, no group holds more than W units, and the windows do mix W units."""
    window_units = 3
    sampler = BlockSampler([corpus], [1.0], seed=11, streams=2, window_blocks=2 * window_units, unit_blocks=2)
    per_stream = 4  # world 1 x 8 positions: positions 0-3 stream 0, 4-7 stream 1
    steps = corpus.num_sequences // 8 - 2  # within epoch 0 for both streams
    for stream in (0, 1):
        draws = [sampler.batch_refs(step, 0, 1, 8)[stream * per_stream + j] for step in range(steps)
                 for j in range(per_stream)]
        span: dict[int, list[int]] = defaultdict(list)
        for index, ref in enumerate(draws):
            span[unit_of(sampler, ref)].append(index)
        intervals = sorted((min(v), max(v), unit) for unit, v in span.items())
        groups, end = [], -1
        for lo, hi, unit in intervals:
            if lo > end:
                groups.append([])
            groups[-1].append(unit)
            end = max(end, hi)
        full = groups[:-1]  # the last window may be partly drawn
        assert max(len(g) for g in groups) <= window_units
        assert sum(len(g) == window_units for g in full) >= len(full) // 2
        assert [unit_of(sampler, r) for r in draws] != sorted(unit_of(sampler, r) for r in draws)


def test_streams_own_their_units(corpus):
    """A unit's sequences of an epoch are drawn by one stream only (but for the units cut by a share's end)."""
    sampler = BlockSampler([corpus], [1.0], seed=2, streams=4, window_blocks=4, unit_blocks=2)
    owners: dict[int, set[int]] = defaultdict(set)
    for step in range(corpus.num_sequences // 8 - 1):
        for position, ref in enumerate(sampler.batch_refs(step, 0, 1, 8)):
            if ref.epoch == 0:
                owners[unit_of(sampler, ref)].add(position // 2)
    shared = [unit for unit, streams in owners.items() if len(streams) > 1]
    assert len(shared) <= 3  # at most one unit per boundary between the 4 shares


def test_mixture_quotas_are_exact_in_every_chunk(tmp_path, corpus):
    code = make_source(tmp_path / "code", [200], seed=1)
    math_ = make_source(tmp_path / "math", [40], seed=2)
    # 7:2:1 over chunks of 10 draws: exactly 7, 2 and 1 of every chunk of each stream
    sampler = BlockSampler([corpus, code, math_], [0.7, 0.2, 0.1], seed=4, streams=2, window_blocks=4,
                           unit_blocks=2, mixture_chunk=10)
    for step in range(60):  # world 2 x 10: each stream's 10 draws of a step are one chunk
        for stream in (0, 1):
            refs = sampler.batch_refs(step, stream, 2, 10)
            assert Counter(r.source for r in refs) == {0: 7, 1: 2, 2: 1}
    # each source still goes through every sequence once per epoch in each stream: the small one many times
    math_refs = [r for step in range(60) for r in sampler.batch_refs(step, 0, 1, 20) if r.source == 2]
    assert max(r.epoch for r in math_refs) >= 2
    first = [r.sequence for r in math_refs if r.epoch == 0]
    assert sorted(first) == list(range(40))


def test_mixture_weights_that_do_not_divide_a_chunk_are_kept_within_one_sequence(tmp_path, corpus):
    code = make_source(tmp_path / "code", [200], seed=1)
    math_ = make_source(tmp_path / "math", [40], seed=2)
    weights = [1, 1, 1.5]
    sampler = BlockSampler([corpus, code, math_], weights, seed=5, streams=1, mixture_chunk=16)
    counts = np.zeros(3)
    for step in range(40):  # one stream, 16 positions: a step is one chunk
        chunk = Counter(r.source for r in sampler.batch_refs(step, 0, 1, 16))
        assert all(abs(chunk[i] - 16 * w / 3.5) < 2 for i, w in enumerate(weights))
        counts += [chunk[i] for i in range(3)]
        target = [Fraction(16 * (step + 1)) * Fraction(w) / Fraction(7, 2) for w in (1, 1, Fraction(3, 2))]
        assert all(abs(counts[i] - target[i]) < 1 for i in range(3))


def test_weights_below_one_draw_a_chunk_and_bad_settings_are_config_errors(tmp_path, corpus):
    code = make_source(tmp_path / "code", [200], seed=1)
    with pytest.raises(ConfigError, match="less than one of every data.shuffle_mixture_chunk=100 draws; raise it "
                                          "to at least 1000"):
        BlockSampler([corpus, code], [0.999, 0.001], seed=0, mixture_chunk=100)
    with pytest.raises(ConfigError, match="data.shuffle_streams"):
        BlockSampler([corpus], [1.0], seed=0, streams=0)
    assert BlockSampler([corpus, code], [1.0, 0.0], seed=0).batch_refs(0, 0, 1, 16)  # a zero weight is allowed


def test_streams_divide_the_global_batch_and_are_no_more_than_the_smallest_source(tmp_path, corpus):
    tiny = make_source(tmp_path / "tiny", [3], seed=1)
    sampler = BlockSampler([corpus, tiny], [1, 1], seed=0, streams=8, mixture_chunk=2)
    assert sampler.stream_count(4) == 2  # at most 3 (the tiny source's sequences), dividing 4
    assert BlockSampler([corpus], [1.0], 0).stream_count(4) == 4
    assert BlockSampler([corpus], [1.0], 0, streams=8).stream_count(12) == 6
    refs = [r for step in range(10) for r in sampler.batch_refs(step, 0, 1, 4)]
    tiny_epoch0 = sorted(r.sequence for r in refs if r.source == 1 and r.epoch == 0)
    assert tiny_epoch0 == [0, 1, 2]


def test_resuming_after_n_steps_reads_what_continuing_reads(corpus):
    """A fresh sampler (a restarted process) started at step N through the prefetcher's threads
    yields the batches the run that went on from step 0 read."""
    def batches(sampler, steps, rank):
        prefetcher = Prefetcher(lambda i: read_batch(sampler, i, rank, 2, 4), steps, depth=3, pin_memory=False)
        out = [(index, batch.numpy().copy(), refs) for index, batch, refs, _ in prefetcher]
        prefetcher.close()
        return out

    settings = {"streams": 2, "window_blocks": 4, "unit_blocks": 2}
    for rank in (0, 1):
        continuing = batches(BlockSampler([corpus], [1.0], seed=9, **settings), range(0, 60), rank)
        resumed = batches(BlockSampler([corpus], [1.0], seed=9, **settings), range(35, 60), rank)
        assert [(i, b.tobytes(), r) for i, b, r in continuing[35:]] == [(i, b.tobytes(), r) for i, b, r in resumed]


# -- read amplification through the real streaming source -------------------------------------

AMP_SEQ = 64  # 128 bytes a sequence
AMP_BLOCK = 1024  # 8 sequences a block
AMP_BUCKET = "lmf-sampling"
UNIT_BLOCKS = 8  # a unit is 64 sequences: its 8 blocks + the next one fetched


@pytest.fixture(scope="module")
def big_corpus(s3_endpoint, tmp_path_factory):
    """4 shards of 200 units (6.3 MiB in all: 100 times the 64 KiB cache below), at s3://lmf-sampling/prep."""
    from tests.s3_server import make_bucket

    rng = np.random.default_rng(0)
    shards = [rng.integers(1, 60_000, 200 * 64 * AMP_SEQ + 1, dtype=np.uint16) for _ in range(4)]
    root = write_output(tmp_path_factory.mktemp("amplification") / "prep", {"train": shards}, vocab_size=65_536,
                        block_bytes=AMP_BLOCK)
    client = make_bucket(s3_endpoint, AMP_BUCKET)
    for path in sorted(root.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), AMP_BUCKET, f"prep/{path.relative_to(root).as_posix()}")
    return sum(p.stat().st_size for p in root.glob("shards/*.bin"))


def count_fetches(monkeypatch) -> list[int]:
    """The bytes of every range read from the store from now on (a list the reads append to)."""
    fetches: list[int] = []
    original = S3Bucket.get_range_sized

    def counted(self, key, start, length):
        data, total = original(self, key, start, length)
        fetches.append(len(data))
        return data, total

    monkeypatch.setattr(S3Bucket, "get_range_sized", counted)
    return fetches


def fetched_bytes_per_trained_byte(sampler, source, steps: int, fetches: list) -> float:
    fetches.clear()
    for step in range(steps):
        for rank in range(2):  # two ranks of one node, one cache
            read_batch(sampler, step, rank, 2, 4)
    trained = steps * 8 * AMP_SEQ * source.token_bytes
    return sum(fetches) / trained


def test_bytes_fetched_per_byte_trained_stay_bounded_with_a_corpus_100x_the_cache(s3, big_corpus, tmp_path,
                                                                                monkeypatch):
    fetches = count_fetches(monkeypatch)
    cache_bytes = 64 * AMP_BLOCK
    assert big_corpus >= 100 * cache_bytes
    cache = BlockCache(tmp_path / "cache", max_bytes=cache_bytes)
    source = StreamingSource(f"s3://{AMP_BUCKET}/prep", "train", AMP_SEQ, cache)
    # 2 streams x windows of 2 units (18 blocks each): 36 blocks in use, in a cache of 64
    blocks = BlockSampler([source], [1.0], seed=1, streams=2, window_blocks=2 * UNIT_BLOCKS, unit_blocks=UNIT_BLOCKS)
    ratio = fetched_bytes_per_trained_byte(blocks, source, 160, fetches)  # 5 whole windows per stream
    assert 1.0 < ratio <= 1.25, ratio
    assert cache.cached_bytes() <= cache_bytes

    uniform = GlobalSampler([source], [1.0], seed=1)  # today's shuffle: about a block per sequence
    assert fetched_bytes_per_trained_byte(uniform, source, 16, fetches) > 4


def test_read_amplification_stays_bounded_across_a_schedules_stage_changes(s3, big_corpus, tmp_path, monkeypatch):
    """A batch ramp and a change of sequence length (lmforge.trainer.schedule) keep the block shuffle's
    bound: the streams continue their windows across the stages."""
    from lmforge.trainer.config import TrainConfig
    from lmforge.trainer.schedule import TrainingPlan

    fetches = count_fetches(monkeypatch)
    cache = BlockCache(tmp_path / "cache", max_bytes=64 * AMP_BLOCK)
    schedule = [{"global_batch_tokens": 8 * AMP_SEQ},
                {"start_tokens": 40 * 8 * AMP_SEQ, "global_batch_tokens": 16 * AMP_SEQ},
                {"start_tokens": 80 * 8 * AMP_SEQ, "seq_len": 2 * AMP_SEQ}]
    config = TrainConfig.model_validate({
        "data": {"sources": [{"path": f"s3://{AMP_BUCKET}/prep"}], "seq_len": AMP_SEQ, "batch_size": 4},
        "model": {"overrides": {"context_length": 2 * AMP_SEQ}}, "steps": 100, "schedule": schedule})
    plan = TrainingPlan.of(config, dp_size=2)
    source = StreamingSource(f"s3://{AMP_BUCKET}/prep", "train", 2 * AMP_SEQ, cache)  # the longest stage's
    sampler = BlockSampler([source], [1.0], seed=1, streams=2, window_blocks=2 * UNIT_BLOCKS,
                           unit_blocks=UNIT_BLOCKS, plan=plan)
    trained = 0
    for index in range(plan.batch_index(plan.steps)):
        step, _ = plan.locate(index)
        for rank in range(2):
            tokens, _ = read_batch(sampler, index, rank, 2, plan.per_rank(step))
            trained += tokens[:, :-1].size * source.token_bytes
    assert {plan.stage(s).index for s in range(plan.steps)} == {0, 1, 2}
    assert 1.0 < sum(fetches) / trained <= 1.25, sum(fetches) / trained
