"""Context parallelism (all-gathered keys and values, load-balanced chunks): CP = 2 under
torchrun (gloo, CPU, fp32) gives the one-process logits, loss, gradients and per-step training
losses within 1e-5, for a tiny Llama-style model (GQA, RoPE with Llama 3 scaling) and the
GPT-2 shape (learned positions). The worker is this file run as a module."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from lmforge.common.errors import ConfigError
from lmforge.model.config import GPTConfig
from lmforge.model.transformer import GPT
from lmforge.trainer.context_parallel import (
    all_reduce_gradients,
    apply_context_parallel,
    context_parallel_forward,
    gather_sequence,
    shard_sequence,
    unshard_sequence,
)

CONFIGS = {
    "llama": {"preset": "llama-debug", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 64,
              "context_length": 32, "vocab_size": 128},
    "gpt": {"preset": "tiny", "positions": "learned", "n_layer": 2, "n_head": 4, "n_embd": 64,
            "context_length": 32, "vocab_size": 128},
}
BATCH, SEQ_LEN, STEPS = 2, 32, 10
TOLERANCE = 1e-5


def build_model(name: str) -> GPT:
    fields = dict(CONFIGS[name])
    torch.manual_seed(0)
    return GPT(GPTConfig.preset(fields.pop("preset"), **fields))


def batches(vocab_size: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ids, targets) for each step: two random batches in turn, so the loss falls as they are learnt."""
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(vocab_size, (2, BATCH, SEQ_LEN + 1), generator=generator)
    return [(tokens[i % 2, :, :-1], tokens[i % 2, :, 1:]) for i in range(steps)]


def one_process(name: str) -> dict:
    """The reference: logits, loss and gradients of the first batch, then STEPS training losses."""
    model = build_model(name)
    data = batches(model.config.vocab_size, STEPS)
    logits, loss = model(*data[0])
    loss.backward()
    result = {"logits": logits.detach(), "loss": loss.item(),
              "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}

    def step(idx, targets):
        loss = model(idx, targets)[1]
        return loss, loss

    return {**result, "losses": train(model, data, step, reduce_gradients=lambda: None)}


def context_parallel(name: str, group) -> dict:
    """The same on this rank of a cp group, the model's attention gathering keys and values;
    parameters replicated, gradients summed over the group."""
    model = apply_context_parallel(build_model(name), group)
    data = batches(model.config.vocab_size, STEPS)
    logits, share, mean = context_parallel_forward(model, *data[0], group)
    share.backward()
    all_reduce_gradients(model, group)
    result = {"logits": gather_sequence(logits.detach(), group), "loss": mean.item(),
              "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}

    def step(idx, targets):
        _, share, mean = context_parallel_forward(model, idx, targets, group)
        return share, mean

    return {**result, "losses": train(model, data, step, lambda: all_reduce_gradients(model, group))}


def train(model, data, step, reduce_gradients) -> list[float]:
    """Plain AdamW steps; `step` gives (the loss to backpropagate, the loss to log)."""
    model.zero_grad()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    losses = []
    for idx, targets in data:
        backward, logged = step(idx, targets)
        backward.backward()
        reduce_gradients()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(logged.item())
    return losses


def worker(out: Path) -> None:
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    results = {name: context_parallel(name, dist.group.WORLD) for name in CONFIGS}
    try:
        apply_context_parallel(GPT(GPTConfig.preset("moe-debug", n_layer=1)), dist.group.WORLD)
    except ConfigError as error:
        results["moe_refusal"] = str(error)
    torch.save(results, out / f"rank{dist.get_rank()}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def cp_results(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("cp")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "tests.trainer.test_context_parallel", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=root, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return [torch.load(out / f"rank{rank}.pt") for rank in range(2)]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cp2_matches_one_process(cp_results, name):
    single = one_process(name)
    for rank, ranks in enumerate(cp_results):
        cp = ranks[name]
        assert max_diff(cp["logits"], single["logits"]) <= TOLERANCE, rank
        assert abs(cp["loss"] - single["loss"]) <= TOLERANCE, rank
        assert cp["grads"].keys() == single["grads"].keys()
        worst = max(max_diff(cp["grads"][n], g) for n, g in single["grads"].items())
        assert worst <= TOLERANCE, (rank, worst)
        steps = list(zip(single["losses"], cp["losses"], strict=True))
        assert len(steps) >= 10 and max(abs(a - b) for a, b in steps) <= TOLERANCE, steps
    assert single["losses"][-1] < single["losses"][0] - 0.5  # it learns: not a comparison of constants


def test_the_moe_option_is_refused_naming_the_axis(cp_results):
    assert cp_results[0]["moe_refusal"].startswith("parallel.cp=2: context parallelism does not support the MoE")


def test_load_balanced_shards_and_their_inverse():
    cp, seq = 3, 24
    tokens = torch.arange(2 * seq).view(2, seq)
    shards = [shard_sequence(tokens, cp, rank) for rank in range(cp)]
    assert shards[0][0].tolist() == [0, 1, 2, 3, 20, 21, 22, 23]  # chunks 0 and 2·cp−1
    assert torch.equal(unshard_sequence(shards), tokens)
    causal_work = [(shard[0] + 1).sum().item() for shard in shards]  # keys each query attends to
    assert len(set(causal_work)) == 1


def test_sequence_not_divisible_by_twice_cp_is_refused():
    refusal = r"^parallel\.cp=2: data\.seq_len = 30 is not divisible by 2·cp = 4"  # the rulebook's message
    with pytest.raises(ConfigError, match=refusal) as error:
        shard_sequence(torch.zeros(2, 30), cp=2, rank=0)
    assert "\n" not in str(error.value)


def test_explicit_positions_equal_the_default():
    """GPT.forward(positions=0..T-1) is the model's own forward; a shard with its global
    positions gets the full sequence's embeddings and rotations."""
    for name in CONFIGS:
        model = build_model(name).eval()
        idx, _ = batches(model.config.vocab_size, 1)[0]
        positions = torch.arange(SEQ_LEN).expand(BATCH, -1)
        assert torch.equal(model(idx, positions=positions)[0], model(idx)[0])


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
