"""Expert parallelism (torchrun, 2 gloo ranks, CPU, fp32) against the same MoE in one process on
the concatenated batch: the MoE block's outputs, drops, aux loss, stats, bias-balancing update and
gradients (after the data-parallel reduction); 10 training steps of a 2-layer MoE model with
clipping by the whole model's norm (ep=2; ep=2 under FSDP2; two ep groups of one rank), losses and
norms ≤ 1e-5; bf16 tokens into the fp32 sharded experts (FSDP's mixed precision); the sharded
experts saved with DCP and loaded whole into one process. This module is
also the worker: torchrun runs it with `-m`."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from lmforge.model.config import GPTConfig
from lmforge.model.moe import MoE, MoEConfig, moe_layers, update_router_biases
from lmforge.model.transformer import GPT
from lmforge.trainer.checkpoint_reader import SafeFileSystemReader, load_state
from lmforge.trainer.expert_parallel import (
    apply_expert_parallel,
    clip_grad_norm_with_sharded_experts,
    expert_parameters,
    reduce_expert_gradients,
)
from lmforge.trainer.layout_rules import expert_parallel_problems

DIM, HIDDEN, STEPS = 16, 32, 10
TRAINING = ("ep2", "ep2-fsdp", "ep2-checkpointed", "ep1-dp2")
CLIP = 1.0
# capacity_factor 1.0 with a skewed router drops assignments, so drop order matters.
BLOCKS = {
    "swiglu-aux-loss": dict(activation="swiglu", bias=False, config=MoEConfig(num_experts=4, capacity_factor=1.0)),
    "gelu-bias-shared-top1": dict(
        activation="gelu",
        bias=True,
        config=MoEConfig(
            num_experts=4, top_k=1, renormalize=False, capacity_factor=1.0, balancing="bias", shared_expert=True
        ),
    ),
    "eight-experts": dict(activation="swiglu", bias=False, config=MoEConfig(num_experts=8, capacity_factor=1.25)),
}
MODEL = GPTConfig.preset(
    "moe-debug",
    n_layer=2,
    n_head=4,
    n_kv_head=2,
    n_embd=32,
    context_length=16,
    vocab_size=128,
    dropout=0.0,
    moe=dict(num_experts=4, top_k=2, capacity_factor=1.0, balancing="bias", bias_update_rate=0.01),
)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach() - b.detach()).abs().max())


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def reduce_gradients(model: torch.nn.Module, ranks: int, outside_ep=None) -> None:
    """The data-parallel reduction (every rank a data-parallel rank): the expert gradients by
    reduce_expert_gradients, every other gradient averaged (as DDP would)."""
    experts = {id(p) for p in expert_parameters(model)}
    for param in model.parameters():
        if param.grad is not None and id(param) not in experts:
            dist.all_reduce(param.grad)
            param.grad.div_(ranks)
    reduce_expert_gradients(model, ranks, outside_ep)


def compare_grads(reference: torch.nn.Module, sharded: torch.nn.Module, rank: int, ranks: int) -> float:
    worst = 0.0
    sharded_params = dict(sharded.named_parameters())
    for name, param in reference.named_parameters():
        grad = sharded_params[name].grad
        if isinstance(grad, DTensor):
            per_rank = param.shape[0] // ranks
            expected = param.grad[rank * per_rank : (rank + 1) * per_rank]
            worst = max(worst, max_diff(grad.to_local(), expected))
        else:
            worst = max(worst, max_diff(grad, param.grad))
    return worst


def check_block(name: str, mesh, rank: int, ranks: int) -> dict[str, float]:
    spec = BLOCKS[name]
    torch.manual_seed(0)
    reference = MoE(DIM, HIDDEN, spec["config"], spec["activation"], spec["bias"])
    with torch.no_grad():  # a skewed router: experts 0 and 1 overflow
        reference.router.weight[:2] += 0.5 * torch.randn(2, DIM)
    sharded = copy.deepcopy(reference)
    apply_expert_parallel(sharded, mesh)
    x_all = torch.randn(2 * ranks, 6, DIM, requires_grad=True)
    target = torch.randn(2 * ranks, 6, DIM)
    mine = slice(2 * rank, 2 * rank + 2)
    x = x_all.detach()[mine].clone().requires_grad_(True)

    out_all = reference(x_all)
    ((out_all * target).mean() + reference.aux_loss).backward()
    out = sharded(x)
    ((out * target[mine]).mean() + sharded.aux_loss).backward()
    reduce_gradients(sharded, ranks)

    stats, expected_stats = sharded.stats, reference.stats
    result = {
        "output": max_diff(out, out_all[mine]),
        "aux_loss": abs(float(sharded.aux_loss) - float(reference.aux_loss)),
        "stats": max(abs(stats[k] - expected_stats[k]) / max(1.0, abs(expected_stats[k])) for k in expected_stats),
        "dropped_fraction": expected_stats["dropped_fraction"],
        "grads": compare_grads(reference, sharded, rank, ranks),
        # Each rank's input gradient carries every rank's share of the aux loss's gradient
        # (the all-reduce's backward sums): it equals the reference's times the ranks.
        "input_grad": max_diff(x.grad / ranks, x_all.grad[mine]),
    }
    if reference.router.selection_bias is not None:
        reference.update_bias(reference.take_pending_load())
        update_router_biases(sharded, mesh.get_group())
        result["selection_bias"] = max_diff(sharded.router.selection_bias, reference.router.selection_bias)
    reference.eval(), sharded.eval()
    with torch.no_grad():
        result["eval_output"] = max_diff(sharded(x), reference(x_all)[mine])
    return result


def check_training(variant: str, rank: int, ranks: int, out_dir: Path) -> dict[str, float]:
    """STEPS optimizer steps of a 2-layer MoE model, each rank on its share of the global batch,
    against one process. ep2: both ranks one ep group, the other gradients averaged as DDP
    would; ep2-fsdp: the same under FSDP2 (the experts left to EP); ep2-checkpointed: with
    activation checkpointing; ep1-dp2: two ep groups of one
    rank, whose expert gradients are reduced across the groups (the reference then runs each
    group's batch as its own forward, as gradient accumulation would)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    ep = 1 if variant == "ep1-dp2" else ranks
    # EP borrows the data-parallel ranks: ep groups of `ep` ranks, the ranks holding the same
    # experts along "outside_ep"; FSDP shards the rest over every rank.
    mesh = init_device_mesh("cpu", (ranks // ep, ep), mesh_dim_names=("outside_ep", "ep"))
    torch.manual_seed(0)
    reference = GPT(MODEL)
    sharded = copy.deepcopy(reference)
    apply_expert_parallel(sharded, mesh["ep"])
    if variant == "ep2-fsdp":
        ignored = set(expert_parameters(sharded))
        data_parallel = init_device_mesh("cpu", (ranks,), mesh_dim_names=("dp",))
        for block in sharded.blocks:
            fully_shard(block, mesh=data_parallel, ignored_params=ignored)
        fully_shard(sharded, mesh=data_parallel, ignored_params=ignored)
    if variant == "ep2-checkpointed":  # activation checkpointing: the recompute exchanges tokens again
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for index, block in enumerate(sharded.blocks):
            sharded.blocks[index] = checkpoint_wrapper(block)
    outside_ep = mesh["outside_ep"].get_group() if ranks // ep > 1 else None
    optimizers = [
        torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.1, foreach=False) for m in (reference, sharded)
    ]
    generator = torch.Generator().manual_seed(1)
    worst, worst_norm, clipped, dropped = 0.0, 0.0, 0, []
    for _ in range(STEPS):
        tokens = torch.randint(0, MODEL.vocab_size, (2 * ranks, MODEL.context_length + 1), generator=generator)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        expected = 0.0
        for group in range(ranks // ep):
            batch = slice(2 * ep * group, 2 * ep * (group + 1))
            _, loss = reference(inputs[batch], targets[batch])
            (loss * ep / ranks).backward()
            expected += float(loss) * ep / ranks
            dropped.append(reference.moe_stats()["dropped_fraction"])
        mine = slice(2 * rank, 2 * rank + 2)
        _, loss = sharded(inputs[mine], targets[mine])
        loss.backward()
        if variant == "ep2-fsdp":  # FSDP averaged the rest
            reduce_expert_gradients(sharded, ranks, outside_ep)
        else:
            reduce_gradients(sharded, ranks, outside_ep)
        expected_norm = float(torch.nn.utils.clip_grad_norm_(reference.parameters(), CLIP))
        norm = float(clip_grad_norm_with_sharded_experts(sharded, CLIP))
        worst_norm = max(worst_norm, abs(norm - expected_norm) / expected_norm)
        clipped += expected_norm > CLIP
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        worst = max(worst, abs(float(mean_loss) / ranks - expected))
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
        for layer in moe_layers(reference):
            layer.update_bias(layer.take_pending_load())
        update_router_biases(sharded)
    shards = {name: local(value).shape[0] for name, value in sharded.state_dict().items() if ".experts." in name}
    result = {
        "losses": worst,
        "grad_norm": worst_norm,
        "clipped_steps": clipped,
        "max_dropped_fraction": max(dropped),
        "expert_rows": max(shards.values()),
    }
    if variant == "ep2-fsdp":
        result["reload"] = save_and_reload(sharded, reference, mesh["ep"], rank, out_dir)
    return result


def save_and_reload(sharded: torch.nn.Module, reference: torch.nn.Module, mesh, rank: int, out_dir: Path) -> float:
    """Saves the FSDP × EP model with DCP as the trainer does (under "model"); loads it back into an
    EP-only model (another layout): the largest difference of its local tensors from the saved."""
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": sharded.state_dict()}, checkpoint_id=str(out_dir / "dcp"))
    if rank == 0:
        torch.save(reference.state_dict(), out_dir / "reference.pt")
    torch.manual_seed(1)
    restored = GPT(MODEL)
    apply_expert_parallel(restored, mesh)
    state = {"model": restored.state_dict()}
    load_state(state, SafeFileSystemReader(out_dir / "dcp"))
    restored.load_state_dict(state["model"])
    saved = sharded.state_dict()

    def comparable(name: str, value: torch.Tensor) -> torch.Tensor:  # this rank's experts, the rest whole
        if ".experts." in name:
            return local(value)
        return value.full_tensor() if isinstance(value, DTensor) else value

    restored_state = restored.state_dict()
    assert set(restored_state) == set(saved)
    return max(max_diff(comparable(n, restored_state[n]), comparable(n, saved[n])) for n in saved)


def check_mixed_precision(mesh, rank: int, ranks: int) -> dict[str, float]:
    """FSDP's bf16 mixed precision as the trainer runs it: bf16 tokens and router, the sharded
    experts (which FSDP leaves alone) fp32, against one process with every parameter in bf16."""
    spec = BLOCKS["swiglu-aux-loss"]
    torch.manual_seed(0)
    reference = MoE(DIM, HIDDEN, spec["config"], spec["activation"], spec["bias"])
    sharded = copy.deepcopy(reference)
    apply_expert_parallel(sharded, mesh)
    sharded.router.to(torch.bfloat16)
    reference.to(torch.bfloat16)
    x_all = torch.randn(2 * ranks, 6, DIM).to(torch.bfloat16)
    out_all = reference(x_all)
    out = sharded(x_all[2 * rank : 2 * rank + 2])
    out.float().square().sum().backward()
    grads = [p.grad for p in expert_parameters(sharded)]
    return {
        "output": max_diff(out.float(), out_all[2 * rank : 2 * rank + 2].float()) / float(out_all.float().abs().max()),
        "output_bf16": float(out.dtype == torch.bfloat16),
        "expert_grads_fp32": float(all(g is not None and g.dtype == torch.float32 for g in grads)),
    }


def worker(out_dir: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (ranks,), mesh_dim_names=("ep",))
    results = {name: check_block(name, mesh, rank, ranks) for name in BLOCKS}
    results["mixed-precision"] = check_mixed_precision(mesh, rank, ranks)
    for variant in TRAINING:
        results[variant] = check_training(variant, rank, ranks, out_dir)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> tuple[Path, list[dict]]:
    out_dir = tmp_path_factory.mktemp("expert-parallel")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "tests.trainer.test_expert_parallel",
        str(out_dir),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    return out_dir, [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize("block", list(BLOCKS))
def test_moe_block_on_two_ep_ranks_equals_one_process(results, block):
    for rank_results in results[1]:
        got = rank_results[block]
        assert got["dropped_fraction"] > 0  # the capacity limit is exercised
        for key in ("output", "aux_loss", "stats", "eval_output", "selection_bias"):
            assert got.get(key, 0.0) <= 1e-6, (key, got)
        assert got["grads"] <= 1e-5 and got["input_grad"] <= 1e-5, got


@pytest.mark.slow
def test_bf16_tokens_run_the_fp32_experts_in_bf16(results):
    """The trainer's FSDP mixed precision casts what it shards to bf16 but not the experts: their
    matmuls autocast to the tokens' dtype (bf16 rounding from the one-process bf16 block)."""
    for rank_results in results[1]:
        got = rank_results["mixed-precision"]
        assert got["output"] <= 1e-2 and got["output_bf16"] == 1.0 and got["expert_grads_fp32"] == 1.0, got


@pytest.mark.slow
@pytest.mark.parametrize("variant", TRAINING)
def test_training_steps_on_two_ep_ranks_equal_one_process(results, variant):
    for rank_results in results[1]:
        got = rank_results[variant]
        assert got["losses"] <= 1e-5 and got["grad_norm"] <= 1e-5, got
        assert got["clipped_steps"] > 0  # clipping by the whole model's norm is exercised
        assert got["max_dropped_fraction"] > 0
        assert got["expert_rows"] == MODEL.moe.num_experts // (1 if variant == "ep1-dp2" else 2), got


@pytest.mark.slow
def test_sharded_experts_saved_with_dcp_load_under_other_layouts(results):
    out_dir, ranks = results
    for rank_results in ranks:  # FSDP × EP → EP alone: the same tensors
        assert rank_results["ep2-fsdp"]["reload"] == 0.0
    # → one process, as the exporter loads a checkpoint: the whole experts
    model = GPT(MODEL)
    state = {"model": model.state_dict()}
    load_state(state, SafeFileSystemReader(out_dir / "dcp"))
    expected = torch.load(out_dir / "reference.pt")
    assert set(state["model"]) == set(expected)
    for name, value in expected.items():
        assert state["model"][name].shape == value.shape
        assert torch.allclose(state["model"][name], value, atol=1e-5), name


def test_experts_not_divisible_by_ep_are_refused_naming_the_axis():
    """What apply_expert_parallel asks the rulebook for each MoE layer before it shards anything."""
    assert expert_parallel_problems(3, 4, None) == [
        "parallel.ep=3 does not divide the model's num_experts=4: each ep rank holds num_experts/ep experts"]
    assert expert_parallel_problems(2, 4, None) == []


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
