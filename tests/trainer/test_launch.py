"""`lmforge-train run` around torchrun: its ranks die with it, however it is killed, and it exits
with the ranks' documented code, not torchrun's 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from lmforge.trainer.launch import first_failure
from tests.trainer.helpers import random_output, read_metrics

TINY = ["data.seq_len=16", "data.batch_size=2", "parallel.mode=ddp",
        "model.overrides={n_layer: 1, n_head: 2, n_embd: 32, context_length: 16}"]


def launch(*overrides: str, **popen) -> subprocess.Popen:
    command = [sys.executable, "-m", "lmforge.trainer.cli", "run", "--nproc", "2", *TINY, *overrides]
    return subprocess.Popen(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, **popen)


def proc_stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state, ppid, …); None once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        stat = proc_stat(int(entry.name)) if entry.name.isdigit() else None
        if stat is not None and int(stat[1]) == pid:
            found.append(int(entry.name))
    return found


def running(pid: int) -> bool:
    stat = proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")  # a zombie is dead, its parent gone too


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(0.2)


def steps_logged(run_dir: Path) -> int:
    return len(read_metrics(run_dir)) if (run_dir / "metrics.jsonl").exists() else 0


def run_dir_state(run_dir: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("killed", ["process group", "launcher alone"])
def test_ranks_die_with_a_killed_launcher(tmp_path, killed):
    data, run_dir = random_output(tmp_path / "data"), tmp_path / "run"
    launcher = launch(f"data.sources=[{{path: {data}}}]", "steps=100000", f"run_dir={run_dir}",
                      start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ranks: list[int] = []
    try:
        wait_for(lambda: steps_logged(run_dir) >= 1, 180, "step logged")
        started, first = time.monotonic(), steps_logged(run_dir)
        wait_for(lambda: steps_logged(run_dir) >= first + 2, 60, "further steps")
        step_seconds = (time.monotonic() - started) / 2  # how often the run directory changes while ranks train
        ranks = children(launcher.pid)
        assert len(ranks) == 2, ranks
        if killed == "process group":
            os.killpg(launcher.pid, signal.SIGKILL)
        else:
            os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)
        wait_for(lambda: not any(map(running, ranks)), 30, "end of the ranks")
        before = run_dir_state(run_dir)
        time.sleep(5 * step_seconds)  # five steps' time: a rank still training would have logged
        assert run_dir_state(run_dir) == before
    finally:
        for pid in filter(running, ranks):  # the rank of a launcher they outlived
            os.kill(pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


@pytest.mark.slow
def test_a_missing_data_path_exits_3_through_the_launcher(tmp_path):
    missing, run_dir = tmp_path / "no-such-data", tmp_path / "run"
    launcher = launch(f"data.sources=[{{path: {missing}}}]", f"run_dir={run_dir}",
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, stderr = launcher.communicate(timeout=180)
    assert launcher.returncode == 3, stderr[-3000:]  # exit 3, "unusable input" (docs/trainer.md), torchrun's is 1
    errors = [line for line in stderr.splitlines() if ": error: " in line]
    rank_error = f"lmforge trainer: error: data source {missing}: no such directory"
    assert set(errors[:-1]) == {rank_error}, errors  # each rank's one line
    assert errors[-1].startswith("lmforge-train run: error: rank ") and "exited with code 3" in errors[-1]
    assert not run_dir.exists()


def failure(exitcode: int, timestamp: int) -> SimpleNamespace:
    """What first_failure reads of torchrun's ProcessFailure."""
    return SimpleNamespace(exitcode=exitcode, timestamp=timestamp)


def test_the_first_failure_is_not_a_rank_torchrun_terminated_in_the_same_second():
    # Rank 1 exits 3; torchrun sends SIGTERM to rank 0, and both failures carry the same second.
    error = first_failure({0: failure(-signal.SIGTERM, 100), 1: failure(3, 100)})
    assert (error.exit_code, str(error)) == (3, "rank 1 exited with code 3 (the first of 2 failed ranks)")
    # A SIGTERM the whole job received (an eviction) still reports as one.
    error = first_failure({0: failure(-signal.SIGTERM, 100), 1: failure(-signal.SIGTERM, 100)})
    assert (error.exit_code, str(error).split(" (")[0]) == (143, "rank 0 was killed by SIGTERM")
    # Otherwise the earliest failure, then the lowest rank.
    error = first_failure({0: failure(-signal.SIGKILL, 101), 1: failure(7, 100), 2: failure(3, 100)})
    assert (error.exit_code, str(error).split(" (")[0]) == (7, "rank 1 exited with code 7")
