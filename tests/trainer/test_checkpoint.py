"""Checkpoints: exact resume, resharding 2 ranks → 1, torchrun restarts after a killed
rank, and interrupted saves ignored."""

from __future__ import annotations

import json
import shutil

import pytest

from lmforge.trainer.checkpoint import COMMIT_MARKER, committed_steps, step_dir
from lmforge.trainer.metrics_file import by_attempt, latest_per_step, read_records
from tests.trainer.helpers import losses_by_step, random_output, run_trainer

STEPS = 20


def run(run_dir, data, *, nproc=1, mode="none", batch_size=8, kill_at=None, kill_rank=None, restarts=0,
        dropout=0.1, preset=None):
    # Dropout makes the exact-resume tests prove that RNG state is restored; runs compared
    # across world sizes use none, since ranks draw different dropout masks than one process.
    if preset is None:
        model = [f"model.overrides={{n_layer: 2, n_head: 4, n_embd: 64, context_length: 32, dropout: {dropout}}}"]
    else:
        model = [f"model.preset={preset}", f"model.overrides={{dropout: {dropout}}}"]
    overrides = [f"data.sources=[{{path: {data}}}]", "data.seq_len=32", f"data.batch_size={batch_size}",
                 f"parallel.mode={mode}", f"steps={STEPS}", "optim.warmup_steps=2", "optim.lr=0.003",
                 "checkpoint.every=5", f"run_dir={run_dir}", *model]
    return run_trainer(overrides, nproc=nproc, restarts=restarts, kill_at=kill_at, kill_rank=kill_rank,
                       timeout=180)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt")
    data = random_output(tmp / "data")
    result = run(tmp / "ref", data)
    assert result.returncode == 0, result.stderr[-2000:]
    return tmp, data, losses_by_step(tmp / "ref")


def test_checkpoints_are_committed_and_pruned(reference):
    tmp, _, _ = reference
    root = tmp / "ref" / "checkpoints"
    assert committed_steps(root) == [9, 14, 19]  # every 5 steps, keep 3
    meta = json.loads((step_dir(root, 19) / "meta.json").read_text())
    assert meta["step"] == 19 and meta["world_size"] == 1 and len(meta["tokenizer_sha256"]) == 64


def test_killed_and_resumed_run_matches_an_uninterrupted_one(reference):
    tmp, data, expected = reference
    run_dir = tmp / "killed"
    first = run(run_dir, data, kill_at=12)
    assert first.returncode != 0 and max(losses_by_step(run_dir)) == 11
    # Saves are asynchronous: step 9's may still have been in flight when the process died.
    assert committed_steps(run_dir / "checkpoints") in ([4], [4, 9])
    second = run(run_dir, data)
    assert second.returncode == 0, second.stderr[-2000:]
    got = losses_by_step(run_dir)
    assert sorted(got) == list(range(STEPS))
    assert max(abs(got[s] - expected[s]) for s in range(STEPS)) < 1e-6  # data order and dropout RNG too
    # One metrics.jsonl for both attempts, each record stamped with its attempt.
    records = read_records(run_dir / "metrics.jsonl")
    starts = [(r["attempt"], r["resumed_from"], r["first_step"]) for r in records if r["kind"] == "start"]
    resumed = starts[1][1]
    assert starts == [(1, None, 0), (2, resumed, resumed + 1)] and resumed in (4, 9)
    steps = by_attempt(records)
    assert [r["step"] for r in steps[1]] == list(range(12))
    assert [r["step"] for r in steps[2]] == list(range(resumed + 1, STEPS))
    assert [(r["step"], r["attempt"]) for r in latest_per_step(records)] == [
        (s, 1 if s <= resumed else 2) for s in range(STEPS)]
    checkpoints = by_attempt(records, "checkpoint")
    assert [r["step"] for r in checkpoints[1]] in ([4], [4, 9])
    assert [r["step"] for r in checkpoints[2]] == [s for s in (9, 14, 19) if s > resumed]
    assert [(r["attempt"], r["status"]) for r in records if r["kind"] == "end"] == [(2, "finished")]  # 1 was killed
    report = (run_dir / "report.html").read_text()
    assert f'class="marker resume" data-step="{resumed}" data-attempt="2"' in report


def test_llama_debug_resumes_exactly(tmp_path):
    """A killed and resumed run of the Llama-style debug preset logs the uninterrupted run's losses
    (the MoE option: tests/trainer/test_moe_training.py)."""
    preset = "llama-debug"
    data = random_output(tmp_path / "data")
    uninterrupted = run(tmp_path / "ref", data, preset=preset)
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-2000:]
    expected = losses_by_step(tmp_path / "ref")
    run_dir = tmp_path / "killed"
    assert run(run_dir, data, kill_at=12, preset=preset).returncode != 0
    resumed = run(run_dir, data, preset=preset)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    starts = [r for r in read_records(run_dir / "metrics.jsonl") if r["kind"] == "start"]
    assert [r["resumed_from"] in (4, 9) for r in starts] == [False, True]  # from a checkpoint, not step 0
    got = losses_by_step(run_dir)
    assert sorted(got) == list(range(STEPS))
    assert max(abs(got[s] - expected[s]) for s in range(STEPS)) < 1e-6


def test_half_written_checkpoint_is_ignored(reference):
    tmp, data, expected = reference
    run_dir = tmp / "half"
    assert run(run_dir, data, kill_at=12).returncode != 0
    root = run_dir / "checkpoints"
    committed = committed_steps(root)
    fake = step_dir(root, 11)
    shutil.copytree(step_dir(root, committed[-1]), fake)
    (fake / COMMIT_MARKER).unlink()  # as if killed before the commit marker
    (fake / ".metadata").write_bytes(b"garbage")
    assert committed_steps(root) == committed
    assert run(run_dir, data).returncode == 0
    got = losses_by_step(run_dir)
    assert max(abs(got[s] - expected[s]) for s in range(STEPS)) < 1e-6


@pytest.fixture(scope="module")
def reference_without_dropout(reference):
    tmp, data, _ = reference
    result = run(tmp / "ref-nodrop", data, dropout=0.0)
    assert result.returncode == 0, result.stderr[-2000:]
    return tmp, data, losses_by_step(tmp / "ref-nodrop")


@pytest.mark.slow
def test_two_rank_checkpoint_resumes_on_one_rank(reference_without_dropout):
    tmp, data, expected = reference_without_dropout
    run_dir = tmp / "reshard"
    first = run(run_dir, data, nproc=2, mode="fsdp", batch_size=4, kill_at=12, dropout=0.0)
    assert first.returncode != 0
    assert committed_steps(run_dir / "checkpoints") in ([4], [4, 9])
    second = run(run_dir, data, dropout=0.0)  # 1 rank, no parallelism, same global batch
    assert second.returncode == 0, second.stderr[-2000:]
    got = losses_by_step(run_dir)
    assert max(abs(got[s] - expected[s]) for s in range(10, STEPS)) < 1e-4


@pytest.mark.slow
def test_torchrun_restarts_a_killed_rank_from_the_last_checkpoint(reference_without_dropout):
    tmp, data, expected = reference_without_dropout
    run_dir = tmp / "restart"
    result = run(run_dir, data, nproc=2, mode="ddp", batch_size=4, kill_at=12, kill_rank=1, restarts=1,
                 dropout=0.0)
    assert result.returncode == 0, result.stderr[-3000:]
    got = losses_by_step(run_dir)
    assert sorted(got) == list(range(STEPS))
    assert max(abs(got[s] - expected[s]) for s in range(STEPS)) < 1e-4
    assert committed_steps(run_dir / "checkpoints") == [9, 14, 19]
    # torchrun's restart is the file's second attempt
    starts = read_records(run_dir / "metrics.jsonl", "start")
    assert [(r["attempt"], r["restart_count"], r["world_size"]) for r in starts] == [(1, 0, 2), (2, 1, 2)]
