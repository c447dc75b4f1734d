"""Sharded checkpoints with torch.distributed.checkpoint (DCP) and a commit marker
(the layout and protocol: lmforge.common.checkpoint_layout).

Layout: RUN_DIR/checkpoints/step-00000042/
    *.distcp, .metadata        model + optimizer, sharded by DCP (reshardable on load)
    rng-rank00000.pt           each rank's RNG states
    meta.json                  step, config, tokenizer hash, val loss (rank 0)
    COMMITTED                  written last, by rank 0, after every rank has finished
    BAD                        written on resume when the checkpoint failed to load
RUN_DIR/checkpoints/best.json  {"step", "val_loss"} of the best committed checkpoint

A directory without COMMITTED is an interrupted save: readers ignore it, and the next
save of that step replaces it. Retention keeps the newest `keep` committed checkpoints
plus the best one; with purge_requires_upload, also every one the store does not hold
(checkpoint_layout.safe_to_delete: a HEAD of the manifest in the store its UPLOADED marker
names; the trainer is not told the sidecar's destination). Resume
loads the newest committed checkpoint that loads on every rank (through checkpoint_reader:
nothing in a checkpoint is run as code); one that fails is reported, marked BAD and kept (a
later save of its step moves it aside to `step-N.bad`), and the next older one is tried.

Saves are asynchronous by default: the step blocks only while DCP stages the state into
CPU memory (buffers kept from one save to the next, pinned on GPU); a background thread
writes the files over a separate gloo group (so its collectives never interleave with
training's). DCP's final gather completes on rank 0
only after every rank's files are written, so rank 0 commits when its future is done.
At most one save is in flight; the next save (and the end of training) waits for it.
"""

from __future__ import annotations

import contextlib
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
from torch.distributed.checkpoint._nested_dict import flatten_state_dict  # the keys DCP's planner uses
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from lmforge.common.atomic_files import atomic_write_bytes
from lmforge.common.checkpoint_layout import (
    BAD_MARKER,
    BEST_FILE,
    COMMIT_MARKER,
    bad_steps,
    best_checkpoint,
    committed_steps,
    is_committed,
    safe_to_delete,
    set_aside,
    step_dir,
    step_dirs,
)
from lmforge.common.errors import ConfigError, LmforgeError, StorageError, describe_os_error
from lmforge.common.logging import get_logger
from lmforge.trainer.checkpoint_reader import (
    CheckpointReadError,
    SafeFileSystemReader,
    checkpoint_error,
    first_line,
    load_error,
    load_state,
)


class CheckpointMismatchError(ConfigError):
    """A checkpoint whose tensors do not fit the configured model: the config changed, the
    checkpoint is not at fault (it is not marked bad)."""


class NoLoadableCheckpointError(LmforgeError):
    """There are checkpoints to resume from, and none of them loads (each is marked BAD)."""

    exit_code = 7


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


@contextlib.contextmanager
def _write_errors_as_storage_errors(path: Path):
    """DCP reports a rank's failed write (a full disk) as a CheckpointException holding the
    OSError: make that the StorageError (one line, exit 4) it is."""
    try:
        yield
    except dcp.CheckpointException as exc:
        failed = {rank: error for rank, (error, _) in exc.failures.items() if isinstance(error, OSError)}
        if not failed:
            raise
        rank, error = min(failed.items())
        raise StorageError(f"cannot write checkpoint {path} (rank {rank}): {describe_os_error(error)}") from exc


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
        # Steps retention leaves alone for now (rank 0): a weights package being consolidated from one
        # (lmforge.trainer.weights_checkpoint). The weights saver adds and discards; a set's add/discard is atomic.
        self.pinned: set[int] = set()
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

    @property
    def group(self):
        """The gloo group async saves write over (None: the default one, or no process group); the
        weights saver's model-only saves use it too, never while a save of this checkpointer is in flight."""
        return self._group

    def save(self, step: int, model, optimizer, meta: dict, *, val_loss: float | None = None,
             is_best: bool = False) -> float:
        """Start saving `step` on every rank; returns the seconds the caller was blocked."""
        started = time.perf_counter()
        self.wait()
        path = step_dir(self.root, step)
        if _rank() == 0 and (path / BAD_MARKER).exists():
            set_aside(path)  # kept for the operator, out of the new save's way
        elif _rank() == 0 and path.exists():
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
            with _write_errors_as_storage_errors(path):
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
            with _write_errors_as_storage_errors(step_dir(self.root, pending.step)):
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
            if (best is not None and old == best["step"]) or old in self.pinned:
                continue
            if self.purge_requires_upload and not safe_to_delete(self.root, old):
                continue  # not in the store its UPLOADED marker names (checked there); the sidecar frees it later
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
    """Load the newest committed checkpoint that loads on every rank into model, optimizer
    and the RNGs; returns its meta.json (the next step to run is meta["step"] + 1), or None
    when there is no checkpoint at all. A checkpoint that fails on any rank is reported,
    marked BAD and the next older one is tried; all ranks agree on each outcome (a rank that
    fails never lets the others go on from a different step). Raises
    NoLoadableCheckpointError when checkpoints exist and none loads."""
    log = get_logger("trainer", rank=_rank())
    steps, already_bad = _from_rank0((committed_steps(root), bad_steps(root)))
    failed: list[tuple[int, str]] = []
    for step in reversed(steps):
        path = step_dir(root, step)
        prepared, problem = _attempt(_prepare, path, step, model, optimizer)
        problem = _first_problem(problem)
        if problem is not None and problem["mismatch"]:
            raise CheckpointMismatchError(problem["error"])
        if problem is None:  # every rank is ready: DCP's load is collective from here on
            _, problem = _attempt(_load_weights, prepared, model, optimizer)
            problem = _first_problem(problem)
        if problem is None:
            _, meta, rng, _ = prepared
            _apply_rng(rng)
            log.info("checkpoint_loaded", step=step, path=str(path), skipped_bad=[s for s, _ in failed])
            return meta
        _mark_bad(path, step, problem, log)
        failed.append((step, problem["error"]))
    if failed or already_bad:
        marked = ", ".join(str(s) for s in sorted({s for s, _ in failed} | set(already_bad), reverse=True))
        detail = f"step {failed[0][0]}: {failed[0][1]}" if failed else f"see the {BAD_MARKER} file in each"
        raise NoLoadableCheckpointError(
            f"{root}: no checkpoint loads; step(s) {marked} are marked {BAD_MARKER} ({detail}). Remove a "
            f"{BAD_MARKER} file to retry that step, or move the step directories away to start over")
    return None


def _from_rank0(value):
    """Rank 0's `value` on every rank: every rank walks the same list of candidates."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _attempt(fn, *args):
    """(fn(*args), None), or (None, the problem) when it raised."""
    try:
        return fn(*args), None
    except (Exception, dcp.CheckpointException) as exc:  # DCP's CheckpointException is a BaseException
        file = exc.file if isinstance(exc, CheckpointReadError) else ""
        error = str(exc) if isinstance(exc, LmforgeError) else first_line(exc, 300)
        return None, {"rank": _rank(), "file": file, "error": " ".join(error.split()),
                      "mismatch": isinstance(exc, CheckpointMismatchError)}


def _first_problem(problem: dict | None) -> dict | None:
    """The first rank's problem, on every rank (None when every rank succeeded)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return problem
    problems: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)
    return next((p for p in problems if p is not None), None)


def _prepare(path: Path, step: int, model, optimizer):
    """Everything a rank checks and reads on its own before the collective load."""
    if not is_committed(path):  # another node's volume may lack what rank 0's has
        raise checkpoint_error(path, "not a committed checkpoint on this node")
    reader = SafeFileSystemReader(path)
    metadata = reader.verify()
    meta_file = path / "meta.json"
    try:
        meta = json.loads(meta_file.read_bytes())
        if meta.get("step") != step:
            raise ValueError(f"says step {meta.get('step')}")
    except (OSError, ValueError, AttributeError) as exc:
        raise checkpoint_error(meta_file, f"unreadable ({exc})") from None
    rng_file = path / f"rng-rank{_rank():05d}.pt"
    rng = None
    if rng_file.exists() or _rank() < meta.get("world_size", 0):  # absent when resuming with more ranks
        try:
            rng = torch.load(rng_file, weights_only=True)
            rng["torch"], rng["cuda"]  # noqa: B018 - both must be there
        except Exception as exc:  # noqa: BLE001 - torch.load's errors are many; the message says which
            raise load_error(rng_file, exc) from None
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    _check_fits(path, metadata, state)
    return reader, meta, rng, state


def _check_fits(path: Path, metadata, state: dict) -> None:
    """Every tensor of `state` is in the checkpoint with the same (global) shape: otherwise
    the model config changed, and every checkpoint of the run would fail the same way."""
    flat, _ = flatten_state_dict(state)
    for key, value in flat.items():
        if not isinstance(value, torch.Tensor):
            continue
        saved = metadata.state_dict_metadata.get(key)
        if not isinstance(saved, TensorStorageMetadata):
            raise CheckpointMismatchError(f"{path}: has no tensor {key}: saved for another model or optimizer "
                                          f"config than this run's")
        if tuple(saved.size) != tuple(value.size()):
            raise CheckpointMismatchError(f"{path}: {key} is {list(saved.size)} there and {list(value.size())} "
                                          f"here: saved for another model config than this run's")


def _load_weights(prepared, model, optimizer) -> None:
    reader, _, _, state = prepared
    load_state(state, reader)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _apply_rng(rng: dict | None) -> None:
    if rng is None:
        return
    torch.set_rng_state(rng["torch"])
    if rng["cuda"]:
        torch.cuda.set_rng_state_all(rng["cuda"])


def _mark_bad(path: Path, step: int, problem: dict, log) -> None:
    """Rank 0: one error line, and the BAD marker (the checkpoint directory is shared by all ranks)."""
    if _rank() != 0:
        return
    log.error("checkpoint_unloadable", step=step, file=problem["file"] or str(path), error=problem["error"],
              failed_rank=problem["rank"], action=f"marked {BAD_MARKER}; trying the next older checkpoint")
    if not path.is_dir():
        return
    record = {"step": step, "file": problem["file"], "reason": problem["error"], "rank": problem["rank"],
              "time": time.time()}
    try:
        atomic_write_bytes(path / BAD_MARKER, json.dumps(record, indent=1).encode())
    except OSError as exc:  # a read-only volume: this run still falls back; the next one retries it
        log.warning("checkpoint_mark_failed", step=step, path=str(path), error=str(exc))
