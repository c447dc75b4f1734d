"""The on-disk checkpoint layout and commit protocol shared by the trainer (writer), the
uploader sidecar (reader/publisher) and restore (DESIGN.md: "a checkpoint exists only once
its commit marker is written").

    CKPT_DIR/step-00000042/...        one directory per step
    CKPT_DIR/step-00000042/COMMITTED  written last by the trainer: the files are complete
    CKPT_DIR/step-00000042/UPLOADED   written by the uploader once the object store has it
    CKPT_DIR/best.json                {"step", "val_loss"} of the best committed checkpoint
"""

from __future__ import annotations

import json
import re
from pathlib import Path

COMMIT_MARKER = "COMMITTED"
UPLOADED_MARKER = "UPLOADED"
BEST_FILE = "best.json"
STEP_PREFIX = "step-"
_STEP_NAME = re.compile(r"step-(\d{8,})")


def step_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def step_dir(root: Path, step: int) -> Path:
    return root / step_name(step)


def parse_step(name: str) -> int | None:
    """The step of a `step-NNNNNNNN` name, else None."""
    match = _STEP_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def step_dirs(root: Path, *, committed: bool) -> list[int]:
    """Steps with (committed=True) or without (False) a commit marker, ascending."""
    if not root.is_dir():
        return []
    steps = []
    for path in root.iterdir():
        step = parse_step(path.name)
        if step is not None and path.is_dir() and (path / COMMIT_MARKER).exists() == committed:
            steps.append(step)
    return sorted(steps)


def committed_steps(root: Path) -> list[int]:
    return step_dirs(root, committed=True)


def best_checkpoint(root: Path) -> dict | None:
    """{"step", "val_loss"} of the best committed checkpoint, or None."""
    path = root / BEST_FILE
    if not path.exists():
        return None
    best = json.loads(path.read_text())
    return best if (step_dir(root, best["step"]) / COMMIT_MARKER).exists() else None
