"""Pipeline parallelism (lmforge.trainer.pipeline_parallel) on 2 stages (torchrun, gloo, CPU, fp32) matches one
process step by step: GPipe and 1F1B over 4 micro-batches, interleaved 1F1B with 2 virtual stages
per rank, 1F1B with gradient accumulation, and PP 2 x FSDP 2 on 4 ranks; AdamW with gradient clipping
engaged (the global norm over both stages equals one process's), then a forward-only eval loss. Run
as a module, this file is the torchrun worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lmforge.common.errors import ConfigError
from lmforge.model.config import GPTConfig
from lmforge.model.transformer import GPT
from lmforge.trainer.layout_rules import PIPELINE_SCHEDULES, ModelDims, pipeline_problems, refuse
from lmforge.trainer.pipeline_parallel import SCHEDULES, bubble_fraction, chunk_layers, split_model

STEPS = 12
BATCH, SEQ = 8, 16
MAX_NORM = 0.5  # below the gradient norms of the first steps, so clipping is exercised
TINY = {"n_layer": 4, "n_head": 4, "n_kv_head": 2, "n_embd": 64, "context_length": SEQ, "vocab_size": 256,
        "multiple_of": 32, "tie_embeddings": False}


def tiny_config(**overrides) -> GPTConfig:
    return GPTConfig.preset("llama-debug", **{**TINY, **overrides})


def seeded_model() -> GPT:
    torch.manual_seed(0)
    return GPT(tiny_config())


def counting_batches(count: int, seed: int) -> torch.Tensor:
    """(count, BATCH, SEQ + 1) token ids, the same in every process: counting from a random start
    by a random stride of 1 to 3, something a model learns within a few steps."""
    generator = torch.Generator().manual_seed(seed)
    start = torch.randint(0, TINY["vocab_size"], (count, BATCH, 1), generator=generator)
    stride = torch.randint(1, 4, (count, BATCH, 1), generator=generator)
    return (start + stride * torch.arange(SEQ + 1)) % TINY["vocab_size"]


def step_batches() -> torch.Tensor:
    return counting_batches(STEPS, seed=1)


VAL = counting_batches(1, seed=2)[0]  # evaluated after training


def optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=3e-3, weight_decay=0.1)


def one_process() -> tuple[list[float], list[float], float]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workers (OMP_NUM_THREADS=1): the same reduction order
    try:
        return train_one_process()
    finally:
        torch.set_num_threads(threads)


def train_one_process() -> tuple[list[float], list[float], float]:
    model = seeded_model()
    opt = optimizer(model.parameters())
    losses, norms = [], []
    for batch in step_batches():
        opt.zero_grad()
        _, loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM).item())
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        val = model(VAL[:, :-1], VAL[:, 1:])[1].item()
    return losses, norms, val


def pipeline_worker(schedule: str, microbatches: int, virtual_stages: int, grad_accum: int, dp: int,
                    out: Path) -> None:
    """pp = 2 stages × dp data-parallel ranks (FSDP over each stage's chunks when dp > 1), each
    data-parallel rank on its share of every batch."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from lmforge.trainer.pipeline_parallel import build_pipeline, clip_grad_norm_pipeline, pipeline_eval, pipeline_step

    mesh = init_device_mesh("cpu", (2, dp), mesh_dim_names=("pp", "dp_shard"))
    pp_group, dp_group = mesh.get_group("pp"), mesh.get_group("dp_shard")

    def shard(chunk) -> None:
        for block in chunk.blocks.values():
            fully_shard(block, mesh=mesh["dp_shard"])
        fully_shard(chunk, mesh=mesh["dp_shard"])

    pipeline = build_pipeline(seeded_model(), pp_group, schedule, microbatches, virtual_stages=virtual_stages,
                              grad_accum=grad_accum, parallelize_chunk=shard if dp > 1 else None)
    opt = optimizer(list(pipeline.parameters()))
    losses, norms = [], []
    for batch in step_batches():
        opt.zero_grad()
        loss = torch.zeros(())
        local = batch.chunk(dp)[dist.get_rank(dp_group)]
        for part in local.chunk(grad_accum):
            loss += pipeline_step(pipeline, part[:, :-1], part[:, 1:]) / grad_accum
        norms.append(clip_grad_norm_pipeline(pipeline.parameters(), MAX_NORM, pp_group).item())
        opt.step()
        dist.all_reduce(loss, group=dp_group)
        losses.append(loss.item() / dp)
    for chunk in pipeline.chunks:
        chunk.eval()
    local = VAL.chunk(dp)[dist.get_rank(dp_group)]
    val = pipeline_eval(pipeline, local[:, :-1], local[:, 1:])
    dist.all_reduce(val, group=dp_group)
    result = {"losses": losses, "norms": norms, "val": val.item() / dp, "bubble": pipeline.bubble}
    out.with_suffix(f".{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def reference() -> tuple[list[float], list[float], float]:
    return one_process()


def test_one_process_clips_and_learns(reference):
    losses, norms, _ = reference
    assert losses[-1] < losses[0] - 0.3
    assert max(norms) > MAX_NORM


@pytest.mark.slow
@pytest.mark.parametrize(("schedule", "microbatches", "virtual_stages", "grad_accum", "dp", "bubble"), [
    ("1f1b", 4, 1, 1, 1, 1 / 4),
    ("gpipe", 4, 1, 1, 1, 1 / 4),
    ("interleaved_1f1b", 4, 2, 1, 1, 1 / 8),  # 4 chunks of one block each
    ("1f1b", 2, 1, 2, 1, 1 / 2),  # 2 accumulated pipeline steps of 4 sequences
    ("1f1b", 2, 1, 1, 2, 1 / 2),  # PP 2 x FSDP 2 (4 ranks), 4 sequences per data-parallel rank
])
def test_two_stage_pipeline_matches_one_process(tmp_path, reference, schedule, microbatches, virtual_stages,
                                                grad_accum, dp, bubble):
    out = tmp_path / "result"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={2 * dp}", "-m",
               "tests.trainer.test_pipeline_parallel", schedule, str(microbatches), str(virtual_stages),
               str(grad_accum), str(dp), str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=Path(__file__).parents[2])
    assert result.returncode == 0, result.stderr[-3000:]
    single_losses, single_norms, single_val = reference
    for rank in range(2 * dp):
        ranked = json.loads(out.with_suffix(f".{rank}.json").read_text())
        assert max(abs(a - b) for a, b in zip(single_losses, ranked["losses"], strict=True)) <= 1e-5, (
            list(zip(single_losses, ranked["losses"])))
        # The norm (about 2) sums every gradient's square in another order: equal to 1e-5 relative.
        assert ranked["norms"] == pytest.approx(single_norms, rel=1e-5, abs=0)
        assert abs(ranked["val"] - single_val) <= 1e-5, (ranked["val"], single_val)
        assert ranked["bubble"] == pytest.approx(bubble)


def test_chunks_keep_the_full_models_parameter_names():
    model = seeded_model()
    full = dict(model.named_parameters())
    names = []
    for rank in (0, 1):
        for chunk in split_model(model, rank, pp=2, virtual_stages=2).values():
            for name, param in chunk.named_parameters():
                assert param is full[name]
                names.append(name)
    assert sorted(names) == sorted(full)
    assert [list(layers) for layers in chunk_layers(8, 4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_chunks_in_sequence_compute_the_models_logits():
    model = seeded_model()
    tokens = step_batches()[0, :, :-1]
    x = tokens
    for stage in range(4):
        (chunk,) = split_model(model, stage, pp=4).values()
        x = chunk(x)
    torch.testing.assert_close(x, model(tokens)[0], rtol=0, atol=0)


@pytest.mark.parametrize(("config", "pp", "schedule", "microbatches", "virtual", "message"), [
    (tiny_config(), 3, "1f1b", 4, 1, "parallel.pp: n_layer 4 does not divide into pp 3 x 1 virtual stages"),
    (tiny_config(), 2, "interleaved_1f1b", 4, 3, "parallel.pp: n_layer 4 does not divide into pp 2 x 3"),
    (tiny_config(tie_embeddings=True), 2, "1f1b", 4, 1, "parallel.pp: pp 2 needs untied embeddings"),
    (tiny_config(moe={"num_experts": 4, "top_k": 2}), 2, "1f1b", 4, 1, "parallel.pp: pp 2 does not run the MoE"),
    (tiny_config(), 2, "zero_bubble", 4, 1, "parallel.pp: unknown pipeline schedule 'zero_bubble'"),
    (tiny_config(), 2, "interleaved_1f1b", 4, 1, "parallel.pp: schedule interleaved_1f1b needs at least 2"),
    (tiny_config(), 2, "1f1b", 4, 2, "parallel.pp: schedule 1f1b runs one stage per rank"),
    (tiny_config(), 4, "1f1b", 2, 1, "parallel.pp_microbatches: 2 micro-batches cannot fill pp 4 stages"),
    (tiny_config(), 2, "interleaved_1f1b", 3, 2, "parallel.pp_microbatches: 3 is not a multiple of pp 2"),
])
def test_layouts_the_pipeline_cannot_run_are_refused(config, pp, schedule, microbatches, virtual, message):
    """The rulebook's refusals, as build_pipeline raises them (ConfigError, the first problem, one line)."""
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as refusal:
        refuse(pipeline_problems(pp, microbatches, ModelDims.of(config), schedule, virtual))
    assert "\n" not in str(refusal.value)


def test_tied_model_runs_without_a_pipeline():
    assert pipeline_problems(1, 1, ModelDims.of(tiny_config(tie_embeddings=True)), "1f1b") == []


def test_every_schedule_the_rulebook_allows_is_built():
    assert set(SCHEDULES) == set(PIPELINE_SCHEDULES)


def test_bubble_fraction():
    assert bubble_fraction(4, 8) == pytest.approx(3 / 8)
    assert bubble_fraction(4, 8, virtual_stages=2) == pytest.approx(3 / 16)
    assert bubble_fraction(1, 8) == 0


if __name__ == "__main__":
    pipeline_worker(sys.argv[1], *map(int, sys.argv[2:6]), Path(sys.argv[6]))
