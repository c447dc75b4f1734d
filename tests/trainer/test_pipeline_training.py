"""Pipeline parallelism in the trainer (`parallel.pp`; torchrun, gloo, CPU, fp32): 1F1B, GPipe,
interleaved 1F1B, 1F1B with gradient accumulation, PP 2 × FSDP 2, PP 2 × TP 2, PP 2 × CP 2 and
PP 2 × CP 2 × TP 2 log a one-process run's losses and val losses step by step (each data-parallel rank
reads data.batch_size × micro-batches sequences; the stages of a pipeline read the same ones, each cp
rank its shard of them; under cp the grad norms match too); a PP 2 × FSDP 2 checkpoint resumes on 4
FSDP ranks and exports; layouts a pipeline cannot run are refused before any process group."""

from __future__ import annotations

import json

import pytest
import torch

from lmforge.model.package import load_package
from lmforge.trainer.data import ShardSource
from lmforge.trainer.export import export
from lmforge.trainer.sampling import BlockSampler
from tests.trainer.helpers import random_output, read_metrics, run_trainer
from tests.trainer.test_tensor_parallel import refused_at_start

STEPS = 12
BATCH = 8  # sequences per step: the one process's data.batch_size
# llama-debug (4 layers: 2 pipeline stages, or 2 × 2 interleaved chunks), narrower, with an untied head.
MODEL = ["model.preset=llama-debug", "model.overrides={tie_embeddings: false, n_embd: 64, n_head: 4, n_kv_head: 2}"]
# fp32: the stages run the one process's operations on the same numbers; only the cross-entropy's
# micro-batch means are summed in another order (and FSDP's reduce-scatter for PP × FSDP).
TOLERANCE = 1e-5
TP_TOLERANCE = 5e-5  # tensor parallelism's sums run in another order: test_tensor_parallel.TOLERANCE's reason


def overrides(data, run_dir, batch_size: int, *extra: str) -> list[str]:
    return [f"data.sources=[{{path: {data}}}]", "data.seq_len=32", f"data.batch_size={batch_size}", f"steps={STEPS}",
            "optim.warmup_steps=2", "optim.lr=0.003", f"run_dir={run_dir}", *MODEL, *extra]


def train(data, run_dir, nproc: int, batch_size: int, *extra: str) -> tuple[list[dict], list[dict], str]:
    """The run's step and eval records and its stdout (every step logged once)."""
    result = run_trainer(overrides(data, run_dir, batch_size, "eval_every=6", "eval_batches=2", *extra), nproc=nproc)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = read_metrics(run_dir)
    assert [r["step"] for r in steps] == list(range(STEPS))
    return steps, read_metrics(run_dir, "eval"), result.stdout


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipeline-training")
    data = random_output(tmp / "data")
    steps, evals, _ = train(data, tmp / "single", 1, BATCH)
    return tmp, data, [r["loss"] for r in steps], [r["val_loss"] for r in evals], [r["grad_norm"] for r in steps]


def assert_matches(single: list[float], losses: list[float], tolerance: float = TOLERANCE) -> None:
    assert max(abs(a - b) for a, b in zip(single, losses, strict=True)) <= tolerance, list(zip(single, losses))


def test_the_one_process_reference_learns(reference):
    _, _, losses, _, _ = reference
    assert losses[-1] < losses[0] - 0.5


@pytest.mark.slow
@pytest.mark.parametrize(("name", "nproc", "batch_size", "extra", "bubble"), [
    ("1f1b", 2, 4, ["parallel.pp=2", "parallel.pp_microbatches=2"], 1 / 2),
    ("gpipe", 2, 2, ["parallel.pp=2", "parallel.pp_microbatches=4", "parallel.pp_schedule=gpipe"], 1 / 4),
    # 4 chunks of one block: rank 0 holds blocks 0 and 2 (and the embedding), rank 1 blocks 1 and 3 (and the head)
    ("interleaved", 2, 2, ["parallel.pp=2", "parallel.pp_microbatches=4", "parallel.pp_schedule=interleaved_1f1b",
                           "parallel.pp_virtual_stages=2"], 1 / 8),
    ("1f1b-grad-accum", 2, 2, ["parallel.pp=2", "grad_accum=2"], 1 / 2),  # pp_microbatches defaults to pp
    ("pp2-fsdp2", 4, 2, ["parallel.pp=2", "parallel.dp_shard=2", "parallel.pp_microbatches=2"], 1 / 2),
    # the 70B recipe's composition: each stage's chunk tensor-parallel (sequence shards cross the stages)
    ("pp2-tp2", 4, 4, ["parallel.pp=2", "parallel.tp=2", "parallel.pp_microbatches=2"], 1 / 2),
    # each cp rank's load-balanced half of every sequence, cut into micro-batches, with its global positions
    ("pp2-cp2", 4, 4, ["parallel.pp=2", "parallel.cp=2", "parallel.pp_microbatches=2"], 1 / 2),
    # the 70B recipe's whole model-parallel shape: tp-local heads attend the cp sequence inside each stage
    ("pp2-cp2-tp2", 8, 4, ["parallel.pp=2", "parallel.cp=2", "parallel.tp=2", "parallel.pp_microbatches=2"], 1 / 2),
])
def test_pipeline_layouts_match_one_process(reference, name, nproc, batch_size, extra, bubble):
    tmp, data, single, single_val, single_grad_norms = reference
    steps, evals, stdout = train(data, tmp / name, nproc, batch_size, *extra)
    tolerance = TP_TOLERANCE if "parallel.tp=2" in extra else TOLERANCE
    assert_matches(single, [r["loss"] for r in steps], tolerance)
    if "parallel.cp=2" in extra:  # the cp ranks' gradients add up to one process's (Adam would hide a scale)
        assert_matches(single_grad_norms, [r["grad_norm"] for r in steps], tolerance)
    if "grad_accum=2" not in extra:  # (an eval batch is one micro-step's: half the one process's with grad_accum)
        assert_matches(single_val, [r["val_loss"] for r in evals], tolerance)  # pipeline_eval, forward only
    assert {r["pipeline_bubble"] for r in steps} == {bubble}
    assert all(r["tokens_per_second"] * r["step_seconds"] == pytest.approx(BATCH * 32) for r in steps)
    starts = [json.loads(line) for line in stdout.splitlines() if '"train_start"' in line]
    assert len(starts) == nproc and all(s["pipeline_bubble"] == bubble and s["mesh"]["pp"] == 2 for s in starts)
    axes = dict(option.removeprefix("parallel.").split("=") for option in extra if option.startswith("parallel."))
    assert all(s["mesh"][axis] == int(degree) for s in starts for axis, degree in axes.items() if axis in s["mesh"])


@pytest.mark.slow
def test_a_pp_fsdp_checkpoint_resumes_on_fsdp_alone_and_exports(reference):
    """Killed at step 8 under PP 2 × FSDP 2 (checkpoint at step 4), resumed on 4 FSDP ranks: the
    chunks saved the full model's parameter names, DCP reshards them, and steps 5… are the
    uninterrupted run's."""
    tmp, data, single, _, _ = reference
    run_dir = tmp / "pp-to-fsdp"
    common = ["checkpoint.every=5", "checkpoint.keep=5"]
    killed = run_trainer(overrides(data, run_dir, 2, *common, "parallel.pp=2", "parallel.dp_shard=2",
                                   "parallel.pp_microbatches=2"), nproc=4, kill_at=8)
    assert killed.returncode != 0
    resumed = run_trainer(overrides(data, run_dir, 2, *common, "parallel.dp_shard=4"), nproc=4)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [start["resumed_from"] for start in read_metrics(run_dir, "start")] == [None, 4]
    got = {r["step"]: r["loss"] for r in read_metrics(run_dir)}  # the resumed attempt's steps 5… are logged last
    assert_matches(single[5:], [got[step] for step in range(5, STEPS)])

    # export consolidates the pipeline-saved step 4: the package's loss on step 5's batch is the one logged
    package = export(run_dir / "checkpoints" / "step-00000004", tmp / "pp-package")
    model, _ = load_package(package)
    sampler = BlockSampler([ShardSource(data, "train", 32, name="data")], [1.0], seed=1234)
    tokens = torch.from_numpy(sampler.batch(5, 0, 1, BATCH)[0])
    with torch.no_grad():
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
    assert abs(loss.item() - got[5]) <= TOLERANCE


UNTIED = "model.overrides={tie_embeddings: false}"


@pytest.mark.parametrize(("world_size", "extra", "message"), [
    (2, ["parallel.pp=2", "parallel.pp_schedule=interleaved_1f1b", "parallel.pp_virtual_stages=4",
         "model.preset=llama-debug", UNTIED], "parallel.pp: n_layer 4 does not divide into pp 2 x 4 virtual stages"),
    (2, ["parallel.pp=2", "model.preset=llama-debug"], "parallel.pp: pp 2 needs untied embeddings"),
    (2, ["parallel.pp=2", "model.preset=moe-debug", UNTIED], "parallel.pp: pp 2 does not run the MoE option"),
    (4, ["parallel.pp=4", "parallel.pp_microbatches=2", "model.preset=llama-debug", UNTIED],
     "parallel.pp_microbatches: 2 micro-batches cannot fill pp 4 stages"),
    (4, ["parallel.pp=2", "parallel.dp_replicate=2", "model.preset=llama-debug", UNTIED],
     "parallel.pp=2 with DDP (dp_replicate=2)"),
])
def test_a_layout_the_pipeline_cannot_run_is_refused_at_start_with_exit_2(tmp_path, world_size, extra, message):
    assert message in refused_at_start(tmp_path, world_size, *extra)
