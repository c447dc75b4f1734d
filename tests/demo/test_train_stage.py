"""The demo's training step reads what ended attempt 1 from torchrun's failure summary (torchrun
itself exits 1 whatever ended its workers)."""

from __future__ import annotations

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
