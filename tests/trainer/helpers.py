"""Data-prep-shaped outputs for trainer tests (real shard files and a manifest) and
metrics.jsonl reading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from lmforge.sample_data.token_shards import synthetic_output, write_output

__all__ = ["random_output", "read_metrics", "write_output"]


def random_output(root: Path, vocab_size: int = 256, train_tokens: int = 40_000, seed: int = 0,
                  **options) -> Path:
    return synthetic_output(root, vocab_size=vocab_size, train_tokens=train_tokens, seed=seed, **options)


def read_metrics(run_dir: Path, kind: str = "step") -> list[dict]:
    """metrics.jsonl records of one kind ("step", "eval", "memory")."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def losses_by_step(run_dir: Path) -> dict[int, float]:
    """The last logged loss of each step (a resumed run logs the redone steps again)."""
    return {r["step"]: r["loss"] for r in read_metrics(run_dir)}


def run_trainer(overrides: list[str], *, nproc: int = 1, restarts: int = 0, kill_at: int | None = None,
                kill_rank: int | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m lmforge.trainer OVERRIDES` in one process, or under torchrun for several ranks
    (or restarts), one thread each; kill_at/kill_rank arm the trainer's fault injection."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("LMFORGE_TRAINER_KILL_AT_STEP", "LMFORGE_TRAINER_FAULT_RANK"):
        env.pop(name, None)
    if kill_at is not None:
        env["LMFORGE_TRAINER_KILL_AT_STEP"] = str(kill_at)
        if kill_rank is not None:
            env["LMFORGE_TRAINER_FAULT_RANK"] = str(kill_rank)
    launcher = [] if nproc == 1 and not restarts else [
        "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", f"--max-restarts={restarts}"]
    command = [sys.executable, *launcher, "-m", "lmforge.trainer", *overrides]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
