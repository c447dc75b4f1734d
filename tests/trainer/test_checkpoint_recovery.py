"""Resume never crash-loops on a corrupt checkpoint (torchrun, 2 ranks, gloo): one that fails
to load on any rank is reported in one line, marked BAD and kept, and every rank goes on
from the same older checkpoint, with the losses of an uninterrupted run; when none loads,
one line and exit 7, on this start and on every restart after it."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from lmforge.common.checkpoint_layout import BAD_MARKER, bad_steps, committed_steps, step_dir
from tests.trainer.helpers import random_output
from tests.trainer.test_checkpoint import STEPS, losses_by_step, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    """An uninterrupted 2-rank run: checkpoints at steps 9, 14, 19 and every step's loss."""
    tmp = tmp_path_factory.mktemp("recovery")
    data = random_output(tmp / "data")
    result = run(tmp / "ref", data, nproc=2, mode="ddp", batch_size=4)
    assert result.returncode == 0, result.stderr[-2000:]
    assert committed_steps(tmp / "ref" / "checkpoints") == [9, 14, 19]
    return tmp, data, losses_by_step(tmp / "ref")


def copy_of(tmp, name: str):
    """The reference run directory, without its metrics (so they hold only the next run's steps)."""
    shutil.copytree(tmp / "ref", tmp / name, ignore=shutil.ignore_patterns("metrics.jsonl"))
    return tmp / name, tmp / name / "checkpoints"


def truncate(path, keep: int = 100) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def events(stdout: str, event: str) -> list[dict]:
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == event]


def test_corrupt_newest_checkpoints_are_marked_bad_and_the_run_resumes_from_an_older_one(two_rank_run):
    tmp, data, expected = two_rank_run
    run_dir, root = copy_of(tmp, "truncated")
    truncate(step_dir(root, 19) / "__1_0.distcp")  # every rank reads it: DCP fails on both
    truncate(step_dir(root, 14) / "rng-rank00001.pt")  # only rank 1 fails: rank 0 must not go on from 14
    result = run(run_dir, data, nproc=2, mode="ddp", batch_size=4)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr

    got = losses_by_step(run_dir)
    assert sorted(got) == list(range(10, STEPS))  # resumed after step 9, on both ranks
    assert max(abs(got[s] - expected[s]) for s in range(10, STEPS)) < 1e-6
    unloadable = events(result.stdout, "checkpoint_unloadable")
    assert [(e["step"], e["file"]) for e in unloadable] == [
        (19, str(step_dir(root, 19) / "__1_0.distcp")), (14, str(step_dir(root, 14) / "rng-rank00001.pt"))]
    assert "truncated" in unloadable[0]["error"] and unloadable[1]["failed_rank"] == 1
    assert sorted(e["rank"] for e in events(result.stdout, "checkpoint_loaded") if e["step"] == 9) == [0, 1]

    # Kept for the operator, out of the way of the new saves of steps 14 and 19.
    for step, bad_file in ((19, "__1_0.distcp"), (14, "rng-rank00001.pt")):
        kept = root / f"{step_dir(root, step).name}.bad"
        assert json.loads((kept / BAD_MARKER).read_text())["file"].endswith(bad_file)
        assert (kept / bad_file).stat().st_size == 100
    assert committed_steps(root) == [9, 14, 19]


def test_when_no_checkpoint_loads_training_stops_with_one_line_and_exit_7(two_rank_run):
    tmp, data, _ = two_rank_run
    run_dir, root = copy_of(tmp, "all-bad")
    truncate(step_dir(root, 19) / "__0_0.distcp")
    (step_dir(root, 14) / ".metadata").write_bytes(b"not a pickle")
    truncate(step_dir(root, 9) / "rng-rank00000.pt")
    result = run(run_dir, data, nproc=2, mode="ddp", batch_size=4)
    assert result.returncode != 0
    # torchrun reports the first worker's exit code, stops the other (SIGTERM, if it has not
    # exited yet) and exits 1 itself.
    assert re.search(r"Root Cause.*?exitcode\s*:\s*7\b", result.stderr, re.DOTALL), result.stderr[-3000:]
    assert set(re.findall(r"exitcode\s*:\s*(-?\d+)", result.stderr)) <= {"7", "-15"}
    errors = [line for line in result.stderr.splitlines() if line.startswith("lmforge trainer: error:")]
    assert errors and all("no checkpoint loads; step(s) 19, 14, 9 are marked BAD" in e for e in errors)
    assert "CheckpointException" not in result.stderr and "services/trainer" not in result.stderr
    assert [e["step"] for e in events(result.stdout, "checkpoint_unloadable")] == [19, 14, 9]
    assert bad_steps(root) == [9, 14, 19] and committed_steps(root) == []
    assert not (run_dir / "metrics.jsonl").exists() or losses_by_step(run_dir) == {}

    # A restart (the pod's next attempt) fails the same way instead of training from scratch.
    again = run(run_dir, data)
    assert again.returncode == 7
    [line] = again.stderr.strip().splitlines()
    assert line.startswith(f"lmforge trainer: error: {root}: no checkpoint loads; step(s) 19, 14, 9 are marked BAD")
    assert not (run_dir / "metrics.jsonl").exists() or losses_by_step(run_dir) == {}
