"""Sharded checkpoints with torch.distributed.checkpoint (DCP) and a commit marker.

Layout: RUN_DIR/checkpoints/step-00000042/
    *.distcp, .metadata        model + optimizer, sharded by DCP (reshardable on load)
    rng-rank00000.pt           each rank's RNG states
    meta.json                  step, config, tokenizer hash (rank 0)
    COMMITTED                  written last, by rank 0, after every rank has finished

A directory without COMMITTED is an interrupted save: readers ignore it, and the next
save of that step replaces it. Retention keeps the newest `keep` committed checkpoints.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from lmforge.common.logging import get_logger
from lmforge.common.storage import atomic_write_bytes

COMMIT_MARKER = "COMMITTED"
_PREFIX = "step-"


def step_dir(root: Path, step: int) -> Path:
    return root / f"{_PREFIX}{step:08d}"


def committed_steps(root: Path) -> list[int]:
    if not root.exists():
        return []
    steps = []
    for path in root.iterdir():
        if path.name.startswith(_PREFIX) and (path / COMMIT_MARKER).exists():
            steps.append(int(path.name[len(_PREFIX) :]))
    return sorted(steps)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def save(root: Path, step: int, model, optimizer, meta: dict, keep: int) -> Path:
    """Save on every rank; returns the committed directory."""
    path = step_dir(root, step)
    if _rank() == 0 and path.exists():
        shutil.rmtree(path)  # an interrupted earlier attempt at this step
    _barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(path))
    rng = {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}
    torch.save(rng, path / f"rng-rank{_rank():05d}.pt")
    _barrier()  # every rank's shards and RNG file are on disk
    if _rank() == 0:
        atomic_write_bytes(path / "meta.json", json.dumps({"step": step, **meta}, indent=1).encode())
        atomic_write_bytes(path / COMMIT_MARKER, b"")
        for old in committed_steps(root)[:-keep]:
            shutil.rmtree(step_dir(root, old), ignore_errors=True)
    _barrier()
    get_logger("trainer", rank=_rank()).info("checkpoint_saved", step=step, path=str(path))
    return path


def load_latest(root: Path, model, optimizer) -> int | None:
    """Load the newest committed checkpoint into model and optimizer; returns its step
    (the next step to run is step + 1), or None when there is none."""
    steps = committed_steps(root)
    if not steps:
        return None
    step = steps[-1]
    path = step_dir(root, step)
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    rng_file = path / f"rng-rank{_rank():05d}.pt"
    if rng_file.exists():  # absent when resuming with more ranks than saved
        rng = torch.load(rng_file, weights_only=True)
        torch.set_rng_state(rng["torch"])
        if rng["cuda"]:
            torch.cuda.set_rng_state_all(rng["cuda"])
    get_logger("trainer", rank=_rank()).info("checkpoint_loaded", step=step, path=str(path))
    return step
