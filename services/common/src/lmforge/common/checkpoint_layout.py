"""The on-disk checkpoint layout and commit protocol shared by the trainer (writer), the
uploader sidecar (reader/publisher) and restore (docs/design.md: "a checkpoint exists only once
its commit marker is written").

    CKPT_DIR/step-00000042/...        one directory per step
    CKPT_DIR/step-00000042/COMMITTED  written last by the trainer: the files are complete
    CKPT_DIR/step-00000042/UPLOADED   written by the uploader once the object store has it
    CKPT_DIR/step-00000042/BAD        written by the trainer when a committed checkpoint failed
                                      to load ({"step", "file", "reason", …}): no reader uses the step again,
                                      and no cleanup deletes it (an operator may want to look);
                                      a new copy of the step moves it aside to step-N.bad first
    CKPT_DIR/best.json                {"step", "val_loss"} of the best committed checkpoint
"""

from __future__ import annotations

import json
import re
from pathlib import Path

COMMIT_MARKER = "COMMITTED"
UPLOADED_MARKER = "UPLOADED"
BAD_MARKER = "BAD"
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


def is_committed(path: Path) -> bool:
    """A step directory readers may use: committed, and not marked bad."""
    return (path / COMMIT_MARKER).exists() and not (path / BAD_MARKER).exists()


def step_dirs(root: Path, *, committed: bool) -> list[int]:
    """Steps with (committed=True) or without (False) a commit marker, ascending. A step
    marked bad is in neither list."""
    if not root.is_dir():
        return []
    steps = []
    for path in root.iterdir():
        step = parse_step(path.name)
        if step is None or not path.is_dir() or (path / BAD_MARKER).exists():
            continue
        if (path / COMMIT_MARKER).exists() == committed:
            steps.append(step)
    return sorted(steps)


def committed_steps(root: Path) -> list[int]:
    return step_dirs(root, committed=True)


def set_aside(path: Path) -> Path:
    """Move a step directory (one marked bad) out of the way of a new copy of its step, to a
    name no reader takes for a step: `step-N.bad`, `step-N.bad-2`, …; returns the new path."""
    target, n = path.with_name(path.name + ".bad"), 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.bad-{n}")
    path.rename(target)
    return target


def bad_steps(root: Path) -> list[int]:
    """Steps marked bad by the trainer, ascending."""
    if not root.is_dir():
        return []
    return sorted(step for path in root.iterdir()
                  if (step := parse_step(path.name)) is not None and (path / BAD_MARKER).is_file())


def best_checkpoint(root: Path) -> dict | None:
    """{"step", "val_loss"} of the best committed checkpoint, or None."""
    path = root / BEST_FILE
    if not path.exists():
        return None
    best = json.loads(path.read_text())
    return best if is_committed(step_dir(root, best["step"])) else None
