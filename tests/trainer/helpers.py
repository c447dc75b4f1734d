"""Data-prep-shaped outputs for trainer tests (real shard files and a manifest) and
metrics.jsonl reading."""

from __future__ import annotations

import json
from pathlib import Path

from lmforge.sample_data.token_shards import synthetic_output, write_output

__all__ = ["random_output", "read_metrics", "write_output"]


def random_output(root: Path, vocab_size: int = 256, train_tokens: int = 40_000, seed: int = 0) -> Path:
    return synthetic_output(root, vocab_size=vocab_size, train_tokens=train_tokens, seed=seed)


def read_metrics(run_dir: Path, kind: str = "step") -> list[dict]:
    """metrics.jsonl records of one kind ("step", "eval", "memory")."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def losses_by_step(run_dir: Path) -> dict[int, float]:
    """The last logged loss of each step (a resumed run logs the redone steps again)."""
    return {r["step"]: r["loss"] for r in read_metrics(run_dir)}
