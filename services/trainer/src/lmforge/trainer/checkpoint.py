"""Sharded checkpoints with torch.distributed.checkpoint (DCP) and a commit marker
(the layout and protocol: lmforge.common.checkpoint_layout).

Layout: RUN_DIR/checkpoints/step-00000042/
    *.distcp, .metadata        model + optimizer, sharded by DCP (reshardable on load)
    rng-rank00000.pt           each rank's RNG states
    meta.json                  step, config, tokenizer hash, val loss (rank 0)
    COMMITTED                  written last, by rank 0, after every rank has finished
RUN_DIR/checkpoints/best.json  {"step", "val_loss"} of the best committed checkpoint

A directory without COMMITTED is an interrupted save: readers ignore it, and the next
save of that step replaces it. Retention keeps the newest `keep` committed checkpoints
plus the best one.

Saves are asynchronous by default: the step blocks only while DCP stages the state into
CPU memory (buffers kept from one save to the next, pinned on GPU); a background thread
writes the files over a separate gloo group (so its collectives never interleave with
training's). DCP's final gather completes on rank 0
only after every rank's files are written, so rank 0 commits when its future is done.
At most one save is in flight; the next save (and the end of training) waits for it.
"""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from lmforge.common.checkpoint_layout import (
    BEST_FILE,
    COMMIT_MARKER,
    UPLOADED_MARKER,
    best_checkpoint,
    committed_steps,
    step_dir,
    step_dirs,
)
from lmforge.common.logging import get_logger
from lmforge.common.storage import atomic_write_bytes


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


@dataclass
class _Pending:
    step: int
    future: Future | None  # None: a synchronous save, already written
    val_loss: float | None
    is_best: bool
    started: float


class Checkpointer:
    """Saves (sync or async), commits and prunes; one per training run, on every rank."""

    def __init__(self, root: Path, *, keep: int, async_save: bool, timeout_seconds: float = 600.0,
                 purge_requires_upload: bool = False):
        self.root = root
        self.keep = keep
        self.purge_requires_upload = purge_requires_upload
        self.async_save = async_save
        self.last_committed_step: int | None = None
        self._pending: _Pending | None = None
        self._log = get_logger("trainer", rank=_rank())
        self._group = self._stager = None
        if async_save:
            cuda = torch.cuda.is_available()
            # One stager for the whole run: it keeps its CPU copies of the state and refills them.
            self._stager = DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                                        use_async_staging=False, use_non_blocking_copy=cuda))
            if dist.is_initialized():
                self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_seconds))

    @property
    def in_flight(self) -> bool:
        return self._pending is not None

    def save(self, step: int, model, optimizer, meta: dict, *, val_loss: float | None = None,
             is_best: bool = False) -> float:
        """Start saving `step` on every rank; returns the seconds the caller was blocked."""
        started = time.perf_counter()
        self.wait()
        path = step_dir(self.root, step)
        if _rank() == 0 and path.exists():
            shutil.rmtree(path)  # an interrupted earlier attempt at this step
        _barrier()
        path.mkdir(parents=True, exist_ok=True)
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        rng = {"torch": torch.get_rng_state(),
               "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}
        torch.save(rng, path / f"rng-rank{_rank():05d}.pt")
        if _rank() == 0:
            record = {"step": step, **meta, "val_loss": val_loss, "best": is_best}
            atomic_write_bytes(path / "meta.json", json.dumps(record, indent=1).encode())
        future = None
        if self.async_save:
            future = dcp.async_save(state, checkpoint_id=str(path), process_group=self._group,
                                    async_stager=self._stager)
        else:
            dcp.save(state, checkpoint_id=str(path))
        self._pending = _Pending(step, future, val_loss, is_best, started)
        if future is None:
            self.wait()
        return time.perf_counter() - started

    def poll(self) -> int | None:
        """Commit the in-flight save if it has finished; returns the step committed now."""
        if self._pending is None or (self._pending.future is not None and not self._pending.future.done()):
            return None
        return self.wait()

    def wait(self) -> int | None:
        """Block until the in-flight save (if any) is written, then commit it."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        if pending.future is not None:
            pending.future.result()  # raises if any rank failed to write
        if pending.future is None:
            _barrier()  # a synchronous save: every rank's files are on disk after this
        if _rank() == 0:
            self._commit(pending)
        self.last_committed_step = pending.step
        self._log.info("checkpoint_saved", step=pending.step, path=str(step_dir(self.root, pending.step)),
                       seconds=round(time.perf_counter() - pending.started, 3), best=pending.is_best)
        return pending.step

    def _commit(self, pending: _Pending) -> None:
        atomic_write_bytes(step_dir(self.root, pending.step) / COMMIT_MARKER, b"")
        if pending.is_best:
            best = {"step": pending.step, "val_loss": pending.val_loss}
            atomic_write_bytes(self.root / BEST_FILE, json.dumps(best).encode())
        best = best_checkpoint(self.root)
        for old in committed_steps(self.root)[: -self.keep]:
            if best is not None and old == best["step"]:
                continue
            if self.purge_requires_upload and not (step_dir(self.root, old) / UPLOADED_MARKER).exists():
                continue  # the sidecar has not published it yet; it frees the disk itself later
            # The marker first: a deletion cut short never leaves half a checkpoint that looks whole.
            (step_dir(self.root, old) / COMMIT_MARKER).unlink(missing_ok=True)
            shutil.rmtree(step_dir(self.root, old), ignore_errors=True)
        for stale in step_dirs(self.root, committed=False):
            if stale < pending.step:  # interrupted saves that a newer commit supersedes
                shutil.rmtree(step_dir(self.root, stale), ignore_errors=True)

    def close(self) -> None:
        self.wait()
        if self._stager is not None:
            self._stager.close()
            self._stager = None
        if self._group is not None:
            dist.destroy_process_group(self._group)
            self._group = None


def load_latest(root: Path, model, optimizer) -> dict | None:
    """Load the newest committed checkpoint into model and optimizer; returns its meta.json
    (the next step to run is meta["step"] + 1), or None when there is none."""
    steps = committed_steps(root)
    if not steps:
        return None
    path = step_dir(root, steps[-1])
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
    meta = json.loads((path / "meta.json").read_text())
    get_logger("trainer", rank=_rank()).info("checkpoint_loaded", step=meta["step"], path=str(path))
    return meta
