"""The trainer with the mixture-of-experts option (moe-debug at test size, CPU, fp32): it learns
and logs the routing figures (metrics.jsonl, Prometheus, the report), resumes exactly with the
bias-balancing state restored, and 2-rank FSDP matches one process because the expert loads
behind the bias update are summed over the ranks."""

from __future__ import annotations

import json

import pytest
import torch

from lmforge.model.config import GPTConfig
from lmforge.model.transformer import parameter_counts
from lmforge.trainer.checkpoint import step_dir
from lmforge.trainer.checkpoint_reader import SafeFileSystemReader, load_state
from lmforge.trainer.metrics import TrainMetrics
from lmforge.trainer.report_html import write_report
from tests.trainer.helpers import losses_by_step, random_output, read_metrics, run_trainer

STEPS = 20
MOE_FIGURES = ("moe_load_max_over_mean", "moe_dropped_fraction", "moe_balance_loss", "moe_z_loss")


def run(run_dir, data, *, nproc=1, mode="none", batch_size=8, kill_at=None, dropout=0.1, extra=()):
    # Bias balancing with a fast rate: the biases move routing within a few steps, so a resume
    # that lost them, or ranks that updated them from their own loads alone, would show in the losses.
    moe = "{num_experts: 4, top_k: 2, balancing: bias, bias_update_rate: 0.01}"
    model = (f"model.overrides={{n_layer: 2, n_head: 4, n_kv_head: 2, n_embd: 64, context_length: 32, "
             f"dropout: {dropout}, moe: {moe}}}")
    overrides = ["model.preset=moe-debug", f"data.sources=[{{path: {data}}}]", "data.seq_len=32",
                 f"data.batch_size={batch_size}", f"parallel.mode={mode}", f"steps={STEPS}", "optim.warmup_steps=2",
                 "optim.lr=0.003", "checkpoint.every=5", f"run_dir={run_dir}", model, *extra]
    return run_trainer(overrides, nproc=nproc, kill_at=kill_at)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("moe")
    data = random_output(tmp / "data")
    result = run(tmp / "ref", data)
    assert result.returncode == 0, result.stderr[-3000:]
    (start,) = [json.loads(line) for line in result.stdout.splitlines() if '"train_start"' in line]
    return tmp, data, start


def test_moe_run_learns_and_logs_its_routing(reference):
    tmp, _, start = reference
    model = GPTConfig.model_validate(start["model"])
    assert (start["params"], start["active_params"]) == parameter_counts(model)  # top 2 of 4 experts
    assert start["active_params"] < start["params"]
    steps = read_metrics(tmp / "ref")
    assert [r["step"] for r in steps] == list(range(STEPS))
    assert steps[-1]["loss"] < steps[0]["loss"] - 1.0
    for record in steps:
        assert record["moe_load_max_over_mean"] >= 1.0
        assert 0.0 <= record["moe_dropped_fraction"] < 1.0
        assert record["moe_balance_loss"] > 0 and record["moe_z_loss"] > 0
    assert any(r["moe_dropped_fraction"] > 0 for r in steps)  # capacity 1.25 drops some at init

    metrics = TrainMetrics()
    metrics.observe_step(steps[-1], [])
    exposed = {s.name: s.value for family in metrics.registry.collect() for s in family.samples}
    for key in MOE_FIGURES:
        assert exposed[f"lmforge_train_{key}"] == pytest.approx(steps[-1][key])

    report = write_report(tmp / "ref").read_text()
    for key in MOE_FIGURES:
        assert f'data-chart="{key}"' in report

    # The trainer moved each layer's selection bias after every step, and checkpointed it.
    biases = {f"blocks.{layer}.mlp.router.selection_bias": torch.zeros(4) for layer in range(2)}
    load_state({"model": biases}, SafeFileSystemReader(step_dir(tmp / "ref" / "checkpoints", STEPS - 1)))
    for bias in biases.values():
        assert bias.abs().sum() > 0 and torch.allclose(bias / 0.01, (bias / 0.01).round(), atol=1e-4)


def test_killed_moe_run_resumes_exactly(reference):
    tmp, data, _ = reference
    expected = losses_by_step(tmp / "ref")
    run_dir = tmp / "killed"
    assert run(run_dir, data, kill_at=12).returncode != 0
    second = run(run_dir, data)
    assert second.returncode == 0, second.stderr[-3000:]
    got = losses_by_step(run_dir)
    assert sorted(got) == list(range(STEPS))
    assert max(abs(got[s] - expected[s]) for s in range(STEPS)) < 1e-6


@pytest.mark.slow
def test_two_rank_fsdp_moe_matches_one_rank(reference):
    # Capacity (and so the drops) depends on the tokens of a forward: the reference runs the two
    # ranks' batches of 4 as two micro-batches of one step; the bias update sums the loads of
    # both either way.
    tmp, data, _ = reference
    single, double = tmp / "single", tmp / "fsdp"
    assert run(single, data, batch_size=4, dropout=0.0, extra=["grad_accum=2"]).returncode == 0
    result = run(double, data, nproc=2, mode="fsdp", batch_size=4, dropout=0.0)
    assert result.returncode == 0, result.stderr[-3000:]
    one, two = losses_by_step(single), losses_by_step(double)
    assert max(abs(one[s] - two[s]) for s in range(STEPS)) < 1e-4, list(zip(one.values(), two.values()))
