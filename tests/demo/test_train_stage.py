"""The demo's training step reads what ended attempt 1 from torchrun's failure summary (torchrun
itself exits 1 whatever ended its workers)."""

from __future__ import annotations

import json

from lmforge.demo.stages.train import killed_by

# torchrun 2.13's summary, captured from a 2-process run the fault injection killed; rank 1's entry
# shows the SIGTERM torchrun sends a rank still running when another fails.
SIGKILLED = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
lmforge.trainer FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-24_15:25:16
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 20404)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 20404
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-24_15:25:16
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -9 (pid: 20403)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 20403
======================================================
"""


def test_the_root_cause_signal_is_named():
    assert killed_by(SIGKILLED) == "SIGKILL"  # not the SIGTERM torchrun sent the other rank


def test_a_rank_that_exited_with_a_code_was_not_killed():
    exited = SIGKILLED.replace("exitcode  : -9 (pid: 20403)  (SIGKILL)", "exitcode  : 5 (pid: 20403)")
    assert killed_by(exited) is None
    assert killed_by("no failure summary at all") is None


def test_the_curriculum_recipe_trains_its_stages_and_draws_them(tmp_path):
    """`make demo DEMO_ARGS="--set train.recipe=curriculum"`'s trainer command, run for a few steps of a tiny
    model: a short stage, a twice-as-long one with document masking, the anneal over WSD's decay."""
    import os
    import subprocess

    from lmforge.demo.config import TrainSection
    from lmforge.demo.stages.train import torchrun_command
    from lmforge.sample_data.token_shards import synthetic_output
    from lmforge.trainer.metrics_file import read_records

    data = synthetic_output(tmp_path / "prep", train_tokens=20_000, document_tokens=30)
    train = TrainSection(nproc=1, steps=10, seq_len=16, batch_size=4, checkpoint_every=4, interrupt_at=6,
                         eval_every=5, recipe="curriculum")
    command = torchrun_command(train, data, tmp_path / "run", 0)
    result = subprocess.run([*command, "model.overrides={vocab_size: 256}", "optim.warmup_steps=2"],
                            capture_output=True, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    stages = read_records(tmp_path / "run" / "metrics.jsonl", "stage")
    assert [(s["name"], s["step"], s["seq_len"], s["document_masking"]) for s in stages] == [
        ("short", 0, 16, False), ("long", 5, 32, True), ("anneal", 8, 32, True)]
    steps = read_records(tmp_path / "run" / "metrics.jsonl", "step")
    assert steps[2]["lr"] == steps[7]["lr"] > steps[8]["lr"] > steps[9]["lr"]  # WSD decays from the anneal on
    report = (tmp_path / "run" / "report.html").read_text()
    assert all(name in report for name in ("short", "long", "anneal"))


def test_the_evaluation_branch_is_wired_into_the_sidecar_and_the_trainer(tmp_path, monkeypatch):
    """With train.weights_every the trainer writes weights packages and the sidecar, configured by the
    file the demo writes (read back by the uploader's own CLI and config loader), uploads and evaluates
    them with a harness task made of the validation documents' true and foreign continuations."""
    import yaml

    from lmforge.demo.config import TrainSection
    from lmforge.demo.stages import evaluation as stage
    from lmforge.demo.stages.evaluation import TASK, write_continuation_task, write_uploader_config
    from lmforge.demo.stages.train import torchrun_command, uploader_command
    from lmforge.trainer.cli import CLI as TRAINER
    from lmforge.uploader.cli import CLI as UPLOADER

    data = tmp_path / "prep"
    texts = [" ".join(f"w{d}x{i}" for i in range(8 + 3 * d)) for d in range(20)]  # the first two are too short
    monkeypatch.setattr(stage, "validation_documents", lambda folder, count: texts[:count] if folder == data else [])
    train = TrainSection(steps=30, checkpoint_every=10, interrupt_at=24, weights_every=10)
    assert "checkpoint.weights_every=10" in torchrun_command(train, data, tmp_path / "run", 0)
    tasks = write_continuation_task(data, tmp_path / "tasks", questions=5)
    task = yaml.safe_load((tasks / f"{TASK}.yaml").read_text())
    rows = [json.loads(line) for line in (tasks / f"{TASK}.jsonl").read_text().splitlines()]
    documents = [t.split() for t in texts]
    assert task["output_type"] == "multiple_choice" and len(rows) == 5
    for row in rows:  # the marked choice is the words that follow the question in its document
        source = next(w for w in documents if " ".join(w[:12]) == row["question"])
        assert row["choices"][row["answer"]] == " " + " ".join(source[12:16]) and len(row["choices"]) == 3
    config = write_uploader_config(tmp_path / "uploader.yaml", train, data, tasks, "http://127.0.0.1:9091",
                                   "http://127.0.0.1:5000")
    args = UPLOADER.parse_args(uploader_command(tmp_path / "run" / "checkpoints", "s3://b/runs/demo", 0, True,
                                                config)[3:])
    assert args.weights_dir == str(tmp_path / "run" / "weights")
    evaluation = UPLOADER.load_config(args).evaluation
    assert (evaluation.enabled, evaluation.promote, evaluation.max_concurrent) == (True, "pointer", 1)
    job = TRAINER.parse_args([*evaluation.command[1:], "--package", "s3://b/p", "--step", "9", "--out",
                              "s3://b/evals/step-00000009.json"])
    assert (job.command, job.tasks, job.pushgateway) == ("eval-checkpoint", str(tasks), "http://127.0.0.1:9091")
