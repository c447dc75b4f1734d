"""Expert parallelism in the trainer (torchrun, gloo, CPU, fp32; moe-debug at test size, seq_len 32,
10 steps) against one process on the same global batch: EP = 2 (dp_shard = 2, 2 ranks) with
capacity drops logs one process's losses and MoE figures step by step; dp_shard = 4, and HSDP
2 × 2, with ep = 2 (two ep groups: the expert gradients summed across them, the bias update's
loads over all four ranks) its losses and selection biases; an EP checkpoint resumes on 2 FSDP ranks without EP and
exports; ep that does not divide the experts, or ep on a dense model, is refused before any
process group."""

from __future__ import annotations

import pytest
import torch

from lmforge.model.package import load_package
from lmforge.trainer.checkpoint import step_dir
from lmforge.trainer.checkpoint_reader import SafeFileSystemReader, load_state
from lmforge.trainer.data import ShardSource
from lmforge.trainer.export import export
from lmforge.trainer.sampling import BlockSampler
from tests.trainer.helpers import losses_by_step, random_output, read_metrics, run_trainer
from tests.trainer.test_tensor_parallel import refused_at_start

STEPS = 10
TOLERANCE = 1e-5  # fp32; the runs differ by 0 to 1e-6 (summation order), MoE figures by ~6e-8
MOE_FIGURES = ("moe_load_max_over_mean", "moe_dropped_fraction", "moe_balance_loss", "moe_z_loss")
# The preset's capacity factor (1.25) with aux-loss balancing: some assignments dropped at these sizes.
DROPPING = "{num_experts: 4, top_k: 2}"
# A second ep group runs its own MoE forward over half the global batch, with its own capacity and
# balance loss (nonlinear in the batch): one process's losses are reproduced only where nothing is
# dropped (capacity_factor 2 = every token's assignment fits: k/E · 2 = 1) and no balance loss is
# trained (bias balancing, at a rate fast enough for the biases to move the routing within a step).
NO_DROPS = "{num_experts: 4, top_k: 2, capacity_factor: 2.0, balancing: bias, bias_update_rate: 0.01}"


def train(run_dir, data, moe: str, *extra: str, nproc: int = 1, batch_size: int = 8, kill_at: int | None = None):
    model = (f"model.overrides={{n_layer: 2, n_head: 4, n_kv_head: 2, n_embd: 64, context_length: 32, "
             f"dropout: 0.0, moe: {moe}}}")
    overrides = ["model.preset=moe-debug", model, f"data.sources=[{{path: {data}}}]", "data.seq_len=32",
                 f"data.batch_size={batch_size}", f"steps={STEPS}", "optim.warmup_steps=2", "optim.lr=0.003",
                 "checkpoint.every=5", f"run_dir={run_dir}", *extra]
    return run_trainer(overrides, nproc=nproc, kill_at=kill_at)


def steps_of(run_dir) -> dict[int, dict]:
    """Each step's record (a resumed run's redone steps: the last)."""
    return {r["step"]: r for r in read_metrics(run_dir)}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("expert-parallel-training")
    return tmp, random_output(tmp / "data")


def one_process(data, name: str, moe: str) -> dict[int, dict]:
    tmp, source = data
    result = train(tmp / name, source, moe)
    assert result.returncode == 0, result.stderr[-3000:]
    return steps_of(tmp / name)


@pytest.fixture(scope="module")
def dropping_reference(data):
    return one_process(data, "single-dropping", DROPPING)


@pytest.fixture(scope="module")
def no_drop_reference(data):
    return one_process(data, "single-no-drops", NO_DROPS)


def assert_losses_match(single: dict[int, dict], got: dict[int, dict], steps) -> None:
    pairs = [(single[s]["loss"], got[s]["loss"]) for s in steps]
    assert max(abs(a - b) for a, b in pairs) <= TOLERANCE, pairs


@pytest.mark.slow
def test_two_ep_ranks_log_one_process_losses_and_moe_figures(data, dropping_reference):
    """Each rank reads half the global batch; the two run one MoE forward over both halves (rank 0's
    first, as one process concatenates them): the same capacity, drops, aux loss and figures. With
    activation checkpointing: the recompute exchanges the tokens again."""
    tmp, source = data
    result = train(tmp / "ep2", source, DROPPING, "parallel.dp_shard=2", "parallel.ep=2",
                   "parallel.activation_checkpointing=true", nproc=2, batch_size=4)
    assert result.returncode == 0, result.stderr[-3000:]
    got = steps_of(tmp / "ep2")
    assert sorted(got) == list(range(STEPS))
    assert_losses_match(dropping_reference, got, range(STEPS))
    for step, expected in dropping_reference.items():
        for key in (*MOE_FIGURES, "grad_norm"):
            assert abs(got[step][key] - expected[key]) <= 1e-6 * max(1.0, abs(expected[key])), (step, key)
    assert any(r["moe_dropped_fraction"] > 0 for r in dropping_reference.values())  # capacity is exercised


@pytest.mark.slow
@pytest.mark.parametrize(("name", "axes"), [
    ("fsdp4-ep2", ["parallel.dp_shard=4"]),  # outside ep: dp_shard_outside_ep = 2
    ("hsdp2x2-ep2", ["parallel.dp_replicate=2", "parallel.dp_shard=2"]),  # outside ep: dp_replicate = 2
])
def test_two_ep_groups_of_two_ranks_match_one_process(data, no_drop_reference, name, axes):
    """4 ranks, ep = 2: ranks {0, 1} and {2, 3} each hold all experts between them; the ranks
    outside ep that hold the same experts sum their gradients, and the bias update sums every rank's loads."""
    tmp, source = data
    result = train(tmp / name, source, NO_DROPS, *axes, "parallel.ep=2", nproc=4, batch_size=2)
    assert result.returncode == 0, result.stderr[-3000:]
    got = steps_of(tmp / name)
    assert_losses_match(no_drop_reference, got, range(STEPS))
    assert all(r["moe_dropped_fraction"] == 0 for r in got.values())

    biases = {}
    for run in ("single-no-drops", name):
        state = {f"blocks.{layer}.mlp.router.selection_bias": torch.zeros(4) for layer in range(2)}
        load_state({"model": state}, SafeFileSystemReader(step_dir(tmp / run / "checkpoints", STEPS - 1)))
        biases[run] = state
    for key, bias in biases["single-no-drops"].items():
        assert bias.abs().sum() > 0 and torch.equal(biases[name][key], bias), key


@pytest.mark.slow
def test_an_ep_checkpoint_resumes_under_fsdp_alone_and_exports(data, no_drop_reference):
    """Killed at step 7 under EP = 2 (checkpoint at step 4: each expert weight a Shard(0) DTensor on
    the ep mesh at its full shape), resumed on 2 FSDP ranks without EP: DCP reshards the experts and
    their optimizer state, and steps 5… are the uninterrupted run's."""
    tmp, source = data
    run_dir = tmp / "ep-to-fsdp"
    killed = train(run_dir, source, NO_DROPS, "parallel.dp_shard=2", "parallel.ep=2", nproc=2, batch_size=4,
                   kill_at=7)
    assert killed.returncode != 0
    resumed = train(run_dir, source, NO_DROPS, "parallel.dp_shard=2", nproc=2, batch_size=4)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [start["resumed_from"] for start in read_metrics(run_dir, "start")] == [None, 4]
    got = losses_by_step(run_dir)
    assert sorted(got) == list(range(STEPS))
    assert max(abs(got[s] - no_drop_reference[s]["loss"]) for s in range(5, STEPS)) <= TOLERANCE

    # export consolidates the EP-saved step 4: the package's training loss (aux loss included) on
    # step 5's batch is the one logged
    package = export(step_dir(run_dir / "checkpoints", 4), tmp / "ep-package")
    model, _ = load_package(package)
    model.train()
    sampler = BlockSampler([ShardSource(source, "train", 32, name="data")], [1.0], seed=1234)
    tokens = torch.from_numpy(sampler.batch(5, 0, 1, 8)[0])
    with torch.no_grad():
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
    assert abs(loss.item() - got[5]) <= TOLERANCE


def test_an_ep_that_does_not_divide_the_experts_is_refused_at_start_with_exit_2(tmp_path):
    err = refused_at_start(tmp_path, 6, "parallel.dp_shard=-1", "parallel.ep=3", "model.preset=moe-debug")
    assert "parallel.ep=3 does not divide the model's num_experts=4" in err


def test_ep_on_a_dense_model_is_refused_at_start_with_exit_2(tmp_path):
    err = refused_at_start(tmp_path, 2, "parallel.dp_shard=-1", "parallel.ep=2", "model.preset=llama-debug")
    assert "parallel.ep=2: expert parallelism shards a mixture-of-experts model's experts" in err
