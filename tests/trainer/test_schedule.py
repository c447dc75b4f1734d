"""The recipe's schedules (lmforge.trainer.schedule) and what the sampler and the LR make of them:
stages placed by consumed tokens, micro-batches from the global batch on any world size, the LR
over tokens, every sequence once per epoch under a batch ramp, a sequence-length curriculum that
cuts the same token stream, and mixture stages that continue each source's order."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from lmforge.common.errors import ConfigError
from lmforge.trainer.config import TrainConfig
from lmforge.trainer.data import ShardSource
from lmforge.trainer.optim import decay_start_step, learning_rate
from lmforge.trainer.sampling import BlockSampler, GlobalSampler
from lmforge.trainer.schedule import TrainingPlan, resolve_stages
from tests.trainer.helpers import write_output

SEQ = 8
BLOCK = 256


def config(schedule: list[dict], *, steps: int = 40, seq_len: int = 8, batch_size: int = 2,
           sources=("web", "code"), **fields) -> TrainConfig:
    return TrainConfig.model_validate({
        "data": {"sources": [{"path": f"/data/{name}"} for name in sources], "seq_len": seq_len,
                 "batch_size": batch_size},
        "model": {"overrides": {"context_length": 64}}, "steps": steps, "schedule": schedule, **fields})


RAMP = [{"global_batch_tokens": 64}, {"start_tokens": 640, "global_batch_tokens": 128},
        {"start_tokens": 1920, "global_batch_tokens": 256}]


def test_stages_start_at_the_first_step_past_their_tokens():
    plan = TrainingPlan.of(config([{"global_batch_tokens": 64}, {"start_tokens": 100, "global_batch_tokens": 128}]))
    first, second = plan.stages
    assert second.first_step == 2 and second.tokens_before == 128  # 64 + 64 >= 100
    assert [plan.tokens_before(s) for s in range(5)] == [0, 64, 128, 256, 384]
    assert plan.total_tokens == 128 + 38 * 128
    assert plan.tokens_after(plan.steps - 1) == plan.total_tokens


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_micro_batches_come_from_the_global_batch_whatever_the_world_size(dp):
    plan = TrainingPlan.of(config(RAMP), dp_size=dp)
    # 8, 16, 32 sequences of 8 tokens; 2 a rank a micro-batch
    assert [plan.micro_batches(s.first_step) for s in plan.stages] == [8 // (2 * dp), 16 // (2 * dp), 32 // (2 * dp)]
    indices = [plan.locate(i) for i in range(plan.batch_index(plan.steps))]
    assert indices == [(step, m) for step in range(plan.steps) for m in range(plan.micro_batches(step))]
    assert all(plan.batch_index(*at) == i for i, at in enumerate(indices))


def test_without_a_schedule_the_plan_is_the_run_as_before():
    plan = TrainingPlan.of(config([], grad_accum=3), dp_size=2)
    (stage,) = plan.stages
    assert stage.sequences == 2 * 3 * 2 and plan.micro_batches(7) == 3 and plan.locate(22) == (7, 1)
    assert plan.tokens_before(10) == 10 * 12 * 8


@pytest.mark.parametrize(("schedule", "fields", "message"), [
    ([{"start_tokens": 5, "global_batch_tokens": 64}], {}, r"schedule\[0\].start_tokens: the first stage starts at 0"),
    ([{"seq_len": 16}], {}, "the first stage needs one"),
    ([{"global_batch_tokens": 60}], {}, "not a whole number of sequences"),
    ([{"global_batch_tokens": 48, "seq_len": 16}, {"start_tokens": 48, "seq_len": 24, "batch_size": 1}], {},
     "must divide the longest"),
    ([{"global_batch_tokens": 48, "seq_len": 24}], {}, "set the stage's batch_size"),
    ([{"global_batch_tokens": 64}, {"start_tokens": 64, "seq_len": 128, "global_batch_tokens": 128,
                                     "batch_size": 1}], {}, "exceeds the model's context_length"),
    ([{"global_batch_tokens": 64}, {"start_tokens": 64, "mixture": {"books": 1}}], {}, "no source named books"),
    ([{"global_batch_tokens": 64}, {"start_tokens": 10**6}], {}, "is not reached in the run's 40 steps"),
    ([{"global_batch_tokens": 64}, {"start_tokens": 10}, {"start_tokens": 50}], {}, "would run no step"),
    ([{"global_batch_tokens": 64}], {"grad_accum": 2}, "leave grad_accum at 1"),
])
def test_a_bad_schedule_is_refused_naming_the_stage(schedule, fields, message):
    with pytest.raises(ConfigError, match=message):
        TrainingPlan.of(config(schedule, **fields))


def test_stages_inherit_and_long_stages_mask_documents():
    stages = resolve_stages(config([
        {"global_batch_tokens": 64, "rope_theta": 10_000},
        {"start_tokens": 64, "seq_len": 16, "rope_theta": 500_000},
        {"start_tokens": 128, "mixture": {"code": 1}, "document_masking": False}]))
    assert [s.seq_len for s in stages] == [8, 16, 16] and [s.batch_size for s in stages] == [2, 1, 1]
    assert [s.global_batch_tokens for s in stages] == [64, 64, 64]
    assert [s.document_masking for s in stages] == [False, True, False]
    assert [s.rope_theta for s in stages] == [10_000, 500_000, 500_000]
    assert [s.mixture for s in stages] == [(1.0, 1.0), (1.0, 1.0), (0.0, 1.0)]


def test_the_learning_rate_is_a_function_of_consumed_tokens():
    ramp = TrainingPlan.of(config(RAMP, steps=40))
    optim = TrainConfig.model_fields["optim"].default_factory().model_copy(update={"warmup_steps": 4})
    total = ramp.total_tokens
    for step in range(4, 40):  # cosine over the tokens past warmup's
        progress = (ramp.tokens_before(step) - ramp.tokens_before(4)) / (total - ramp.tokens_before(4))
        expected = optim.lr * (optim.min_lr_ratio + (1 - optim.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
        assert learning_rate(step, ramp, optim) == pytest.approx(expected)
    wsd = optim.model_copy(update={"schedule": "wsd", "decay_fraction": 0.25})
    start = decay_start_step(ramp, wsd)
    assert ramp.tokens_before(start) >= 0.75 * total > ramp.tokens_before(start - 1)
    assert learning_rate(start - 1, ramp, wsd) == optim.lr > learning_rate(start, ramp, wsd)
    assert learning_rate(39, ramp, wsd) == pytest.approx(optim.lr * optim.min_lr_ratio)


# -- the sampler under a plan ----------------------------------------------------------------------

def make_source(root, shard_sequences: list[int], seq_len: int, *, seed: int = 0) -> ShardSource:
    rng = np.random.default_rng(seed)
    shards = [rng.integers(1, 60_000, n * SEQ + 1, dtype=np.uint16) for n in shard_sequences]
    write_output(root, {"train": shards}, vocab_size=65_536, block_bytes=BLOCK)
    return ShardSource(root, "train", seq_len, name=root.name)


def all_refs(sampler, plan: TrainingPlan, steps: range, dp: int) -> dict[int, list]:
    """Each step's refs in global-batch position order."""
    out = {}
    for step in steps:
        micro_batches, per_rank = plan.micro_batches(step), plan.per_rank(step)
        by_position = {}
        for rank in range(dp):
            for micro in range(micro_batches):
                refs = sampler.batch_refs(plan.batch_index(step, micro), rank, dp, per_rank)
                for j, ref in enumerate(refs):
                    by_position[(rank * micro_batches + micro) * per_rank + j] = ref
        out[step] = [by_position[p] for p in range(len(by_position))]
    return out


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    return make_source(tmp_path_factory.mktemp("web") / "web", [301, 250, 77, 420], SEQ)


@pytest.fixture(scope="module")
def code(tmp_path_factory):
    return make_source(tmp_path_factory.mktemp("code") / "code", [150, 90], SEQ, seed=1)


def sampler_for(plan, sources, **settings):
    return BlockSampler(sources, [1.0] * len(sources), seed=3, plan=plan,
                        **{"streams": 4, "window_blocks": 4, "unit_blocks": 2, "mixture_chunk": 16, **settings})


def test_every_sequence_once_per_epoch_under_a_batch_ramp(web):
    plan = TrainingPlan.of(config(RAMP, steps=60, sources=("web",)), dp_size=2)
    refs = [r for step in all_refs(sampler_for(plan, [web]), plan, range(60), 2).values() for r in step]
    assert len(refs) > web.num_sequences  # past the first epoch
    first_epoch = [r.sequence for r in refs if r.epoch == 0]
    assert sorted(first_epoch) == list(range(web.num_sequences))


def test_the_batches_are_the_same_on_any_world_size(web, code):
    schedule = [*RAMP, {"start_tokens": 4000, "mixture": {"code": 1}}]
    plans = {dp: TrainingPlan.of(config(schedule, steps=60), dp_size=dp) for dp in (1, 2, 4)}
    batches = {dp: all_refs(sampler_for(plan, [web, code]), plan, range(60), dp) for dp, plan in plans.items()}
    assert batches[1] == batches[2] == batches[4]


def test_a_mixture_stage_continues_each_sources_order(web, code):
    schedule = [{"global_batch_tokens": 64}, {"start_tokens": 64 * 20, "mixture": {"code": 3, "web": 1}},
                {"start_tokens": 64 * 40, "mixture": {"code": 1}}]
    plan = TrainingPlan.of(config(schedule, steps=50))
    steps = all_refs(sampler_for(plan, [web, code]), plan, range(50), 1)
    for stage, (lo, hi), share in ((0, (0, 20), 0.5), (1, (20, 40), 0.75), (2, (40, 50), 1.0)):
        drawn = Counter(r.source for step in range(lo, hi) for r in steps[step])
        assert drawn[1] / sum(drawn.values()) == pytest.approx(share, abs=0.05), stage
    for source in (0, 1):
        seen = [(r.epoch, r.sequence) for step in steps.values() for r in step if r.source == source]
        assert len(seen) == len(set(seen))  # nothing drawn twice across the stages


def test_a_sequence_length_curriculum_cuts_the_same_token_stream(tmp_path):
    long = make_source(tmp_path / "web", [301, 250, 77, 420], 2 * SEQ)  # read at the longest stage's 16 tokens
    short = ShardSource(tmp_path / "web", "train", SEQ)
    schedule = [{"global_batch_tokens": 128}, {"start_tokens": 128 * 15 + 8, "seq_len": 16},
                {"start_tokens": 128 * 40, "seq_len": 8}]
    plan = TrainingPlan.of(config(schedule, steps=80, sources=("web",)), dp_size=2)
    steps = all_refs(sampler_for(plan, [long]), plan, range(80), 2)
    atoms = []
    for step, refs in steps.items():
        seq_len = plan.stage(step).seq_len
        for ref in refs:
            tokens = ref.read([long])
            assert len(tokens) == seq_len + 1
            assert np.array_equal(tokens, long.sequence(ref.sequence)[ref.offset: ref.offset + seq_len + 1])
            atoms += [(ref.epoch, ref.sequence, ref.offset // SEQ + k) for k in range(seq_len // SEQ)]
    assert len(atoms) == len(set(atoms))  # no 8-token piece twice in an epoch
    # the 8-token stages read the pieces of the 16-token sequences: all of them, bar at most one piece a
    # stream at the change to 16 tokens
    first_epoch = {(s, k) for e, s, k in atoms if e == 0}
    expected = 2 * long.num_sequences
    assert len(atoms) > expected and expected - 4 <= len(first_epoch) <= expected
    assert long.num_sequences <= short.num_sequences // 2 + 4


def test_the_uniform_shuffle_takes_a_ramp_and_mixtures_but_not_a_curriculum(web, code):
    plan = TrainingPlan.of(config([*RAMP, {"start_tokens": 4000, "mixture": {"code": 1}}], steps=60))
    sampler = GlobalSampler([web, code], [1.0, 1.0], seed=0, plan=plan)
    steps = all_refs(sampler, plan, range(60), 1)
    assert [len(steps[s]) for s in (0, 10, 30)] == [8, 16, 32]
    assert {r.source for s in range(plan.stages[-1].first_step, 60) for r in steps[s]} == {1}
    curriculum = TrainingPlan.of(config([{"global_batch_tokens": 64}, {"start_tokens": 64, "seq_len": 16}]))
    with pytest.raises(ConfigError, match="needs data.shuffle: blocks"):
        GlobalSampler([web], [1.0], seed=0, plan=curriculum)


def test_a_stage_planned_for_another_mesh_is_a_layout_problem_on_this_one():
    schedule = [{"global_batch_tokens": 64, "mesh": {"dp_shard": 2}},
                {"start_tokens": 640, "mesh": {"dp_shard": 1, "cp": 2}}, {"start_tokens": 1280}]
    mesh = {"dp_replicate": 1, "dp_shard": 2, "tp": 1, "pp": 1, "cp": 1, "ep": 1}
    plan = TrainingPlan.of(config(schedule), dp_size=2, mesh=mesh)
    first, second, third = plan.stages
    assert plan.layout_problem(first) is None
    assert plan.layout_problem(second) == ("schedule[1] (stage-1) is planned for cp 2, dp_shard 1; "
                                           "this run has cp 1, dp_shard 2")
    odd = TrainingPlan.of(config([{"global_batch_tokens": 48}]), dp_size=2)  # 6 sequences, 2 ranks x 2
    assert "a global batch of 6 sequences does not split into micro-batches of 2" in odd.layout_problem(odd.stages[0])
    assert third.mesh == second.mesh  # inherited
    assert TrainingPlan.of(config(schedule), dp_size=2).layout_problem(second) is None  # no mesh given: not checked
