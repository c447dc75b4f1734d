"""Weights-only checkpoints: a serving package every `checkpoint.weights_every` steps (and/or
`weights_every_minutes`) and at the last step, for evaluation branches while training.

Layout (root = RUN_DIR/weights; checkpoint_layout's protocol, so committed_steps, safe_to_delete and
the uploader work on it unchanged):
    weights/step-00000042/   model.safetensors, config.json, tokenizer.json: a package exactly as
                             `lmforge-train export` writes it (lmforge.model.package.write_package)
                             meta.json  {"step", "tokens", "run", "val_loss", "final"}
                             COMMITTED  written last
    weights/.dcp/step-N/     scratch: the model-only DCP save, removed once packaged
    weights/.tokenizer/      an s3:// data source's tokenizer.json, downloaded once

How a package is made, without blocking the step more than an async checkpoint does:
- A model-only `dcp.async_save` (parameters only: about a third of a full Adam save's staging) into
  weights/.dcp/step-N, over the Checkpointer's gloo group and with a stager of its own. Once written,
  rank 0 consolidates it in one background thread (export.consolidate: the same code `export` runs,
  so the package equals `export` of a full checkpoint of that step bit for bit), writes the package,
  meta.json and COMMITTED, removes the scratch and applies retention. Other ranks only write their shards.
- When the full checkpoint of the same step is being saved (`weights_from_full`, default), no second
  save: rank 0 packages from checkpoints/step-N once the Checkpointer has committed it (the step is
  pinned against the Checkpointer's retention until then).
- Two async saves never overlap on the shared group. A package due while the Checkpointer's save is in
  flight is deferred to the first later step at which no save is in flight on any rank (a one-element
  all_reduce, only on steps with a deferred package); it then holds that step's weights and is named by
  it. A full save due while a model-only save is being written waits for that write first.
- The clock cadence uses rank 0's clock only; the caller shares rank 0's verdict with every rank (the
  trainer piggy-backs it on the step record's all-gather, so it is decided on logged steps).

A package is not made twice for a step, and is lost when the process dies before it is committed (a
resumed attempt writes the steps it runs again). The fault hook LMFORGE_TRAINER_ZERO_WEIGHTS_AT_STEP
writes step N's package with every parameter zeroed (faults.zero_weights). Each committed package is
recorded (rank 0) in metrics.jsonl as kind `weights`.
"""

from __future__ import annotations

import json
import queue
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from lmforge.common.atomic_files import atomic_write_bytes
from lmforge.common.checkpoint_layout import (
    COMMIT_MARKER,
    committed_steps,
    safe_to_delete,
    step_dir,
    step_dirs,
    step_name,
)
from lmforge.common.logging import get_logger
from lmforge.model.config import GPTConfig
from lmforge.model.package import write_package
from lmforge.trainer import faults
from lmforge.trainer.config import TrainConfig

SCRATCH = ".dcp"
TOKENIZER_CACHE = ".tokenizer"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


@dataclass
class _Job:
    """One package for the rank-0 thread to write: from `source` (a DCP state directory)."""

    step: int
    source: Path
    meta: dict  # the trainer's checkpoint meta (model_config, tokenizer_sha256) plus the package's meta.json
    scratch: bool  # the source is the model-only save, removed once packaged (else a pinned full checkpoint)
    blocked_seconds: float
    started: float


class WeightsSaver:
    """Starts, defers, packages and prunes weights packages; one per training run, on every rank."""

    def __init__(self, root: Path, config: TrainConfig, checkpointer, *, tokens_after: Callable[[int], int],
                 tokenizer_sha256: str | None = None, record: Callable[[str, dict], None] | None = None,
                 agree: Callable[[bool], bool] | None = None, clock: Callable[[], float] = time.monotonic):
        section = config.checkpoint
        self.root, self.config, self.checkpointer = Path(root), config, checkpointer
        self.every, self.every_minutes, self.keep = section.weights_every, section.weights_every_minutes, \
            section.weights_keep
        self.from_full, self.purge_requires_upload = section.weights_from_full, section.purge_requires_upload
        self.last_step = config.steps - 1
        self.run_name = config.tracking.run_name or Path(config.run_dir).name
        self.tokens_after, self.record = tokens_after, record
        self.agree = agree or (lambda free: free)
        self.clock = clock
        self.last_package_time = clock()
        self.wanted = False  # a package is due and not started yet (deferred)
        self._future: Future | None = None
        self._job: _Job | None = None  # the in-flight model-only save's package
        self._from_full: list[_Job] = []  # rank 0: packages waiting for their full checkpoint's commit
        self._committed: list[dict] = []  # rank 0: the thread's records, written by the main thread
        self._lock = threading.Lock()
        self._tokenizer: Path | None = None
        self._last_step: int | None = None  # the last step after_step saw (a deferred package's at close)
        self._last_val_loss: float | None = None
        self._log = get_logger("trainer", rank=_rank())
        cuda = torch.cuda.is_available()
        self._stager = DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                                    use_async_staging=False, use_non_blocking_copy=cuda))
        self._queue: queue.Queue[_Job | None] | None = None
        self._thread: threading.Thread | None = None
        if _rank() == 0:
            if tokenizer_sha256 is not None:  # a package needs the run's tokenizer.json: refused now, not later
                self._tokenizer_file(tokenizer_sha256)
            shutil.rmtree(self.root / SCRATCH, ignore_errors=True)  # an earlier attempt's unpackaged saves
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._work, name="lmforge-weights", daemon=True)
            self._thread.start()

    # -- cadence -----------------------------------------------------------------------------

    def step_due(self, step: int) -> bool:
        return bool(self.every and (step + 1) % self.every == 0) or step == self.last_step

    def clock_due(self, now: float) -> bool:
        """Rank 0's verdict (the caller shares it): weights_every_minutes since the last package started."""
        return bool(self.every_minutes) and now - self.last_package_time >= self.every_minutes * 60

    def due(self, step: int, now: float) -> bool:
        return self.step_due(step) or self.clock_due(now)

    # -- the training loop's side --------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """This rank has a save in flight on the shared group (the Checkpointer's or a model-only one)."""
        return self.checkpointer.in_flight or self._future is not None

    def after_step(self, step: int, model, meta: dict, *, due: bool, full_save_started: bool,
                   val_loss: float | None = None) -> float:
        """Called on every rank after the step's checkpoint decision (`due`: the same on every rank);
        starts the package when due (or a deferred one), then polls. Returns the seconds blocked."""
        blocked = 0.0
        self._last_step, self._last_val_loss = step, val_loss
        self.wanted = self.wanted or due
        self.poll()
        if self.wanted:
            if full_save_started and self.from_full:
                self._package_from_full(step, meta, val_loss)
            elif self.agree(not self.busy):  # every rank free: no save of either kind in flight anywhere
                blocked = self.save(step, model, meta, val_loss=val_loss)
            self.poll()
        return blocked

    def before_full_save(self) -> None:
        """The Checkpointer's save shares the group: the model-only save in flight is written first."""
        self._finish_save()

    def save(self, step: int, model, meta: dict, *, val_loss: float | None = None) -> float:
        """Start the model-only save of `step` on every rank (nothing else may be in flight on the shared
        group); returns the seconds the caller was blocked (staging)."""
        started = time.perf_counter()
        self.wanted = False
        self.last_package_time = self.clock()
        path = self.root / SCRATCH / step_name(step)
        path.mkdir(parents=True, exist_ok=True)
        state = {"model": get_model_state_dict(model)}
        if self.checkpointer.async_save:
            self._future = dcp.async_save(state, checkpoint_id=str(path), process_group=self.checkpointer.group,
                                          async_stager=self._stager)
        else:
            dcp.save(state, checkpoint_id=str(path))
            self._future = Future()
            self._future.set_result(None)
        blocked = time.perf_counter() - started
        self._job = _Job(step, path, self._package_meta(step, meta, val_loss), True, blocked, started)
        return blocked

    def poll(self) -> None:
        """Hands finished saves to rank 0's thread and records the packages it has committed since."""
        if self._future is not None and self._future.done():
            self._finish_save()
        if self._from_full:
            committed = self.checkpointer.last_committed_step
            ready = [job for job in self._from_full if committed is not None and job.step <= committed]
            for job in ready:
                self._from_full.remove(job)
                self._submit(job)
        with self._lock:
            done, self._committed = self._committed, []
        for record in done:
            if self.record is not None:
                self.record("weights", record)

    def close(self, model=None, meta: dict | None = None) -> None:
        """At the end of training (every rank; before the Checkpointer's close): a package still deferred
        is saved now from `model` (the weights of the last step run), and every package is committed
        before this returns."""
        self.checkpointer.wait()
        self._finish_save()
        self.poll()
        if self.wanted and model is not None and meta is not None and self._last_step is not None:
            self.save(self._last_step, model, meta, val_loss=self._last_val_loss)
            self._finish_save()
        self.poll()
        if self._queue is not None and self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = self._queue = None
        self.poll()  # the records of the last packages
        self._stager.close()

    # -- internals -----------------------------------------------------------------------------

    def _package_meta(self, step: int, meta: dict, val_loss: float | None) -> dict:
        return {"model_config": meta["model_config"], "tokenizer_sha256": meta["tokenizer_sha256"],
                "package": {"step": step, "tokens": self.tokens_after(step), "run": self.run_name,
                            "val_loss": val_loss, "final": step == self.last_step}}

    def _package_from_full(self, step: int, meta: dict, val_loss: float | None) -> None:
        self.wanted = False
        self.last_package_time = self.clock()
        if _rank() != 0:
            return
        self.checkpointer.pinned.add(step)
        job = _Job(step, step_dir(self.checkpointer.root, step), self._package_meta(step, meta, val_loss), False,
                   0.0, time.perf_counter())
        self._from_full.append(job)

    def _finish_save(self) -> None:
        """Wait for this rank's model-only save (if any); rank 0 then queues its package."""
        future, job = self._future, self._job
        if future is None:
            return
        self._future = self._job = None
        future.result()  # raises if any rank failed to write
        if _rank() == 0 and job is not None:
            self._submit(job)

    def _submit(self, job: _Job) -> None:
        assert self._queue is not None
        self._queue.put(job)

    def _work(self) -> None:
        assert self._queue is not None
        while (job := self._queue.get()) is not None:
            try:
                record = self._package(job)
            except Exception as exc:  # noqa: BLE001 - a lost package must not end the training run
                self._log.error("weights_package_failed", step=job.step, error=f"{type(exc).__name__}: {exc}")
                record = {"step": job.step, "timestamp": time.time(), "error": f"{type(exc).__name__}: {exc}"}
            finally:
                if not job.scratch:
                    self.checkpointer.pinned.discard(job.step)
            with self._lock:
                self._committed.append(record)

    def _package(self, job: _Job) -> dict:
        """Consolidate `job.source` into weights/step-N (package, meta.json, COMMITTED last), then retention."""
        from lmforge.trainer.export import consolidate

        out = step_dir(self.root, job.step)
        model = consolidate(job.source, GPTConfig.model_validate(job.meta["model_config"]))
        zeroed = faults.zero_weights(job.step)
        if zeroed:
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.zero_()
        write_package(model, self._tokenizer_file(job.meta["tokenizer_sha256"]), out, step=job.step)
        atomic_write_bytes(out / "meta.json", json.dumps(job.meta["package"], indent=1).encode())
        atomic_write_bytes(out / COMMIT_MARKER, b"")
        if job.scratch:
            shutil.rmtree(job.source, ignore_errors=True)
        self._prune(job.step)
        seconds = time.perf_counter() - job.started
        self._log.info("weights_package_committed", step=job.step, path=str(out), seconds=round(seconds, 3),
                       zeroed=zeroed)
        package = job.meta["package"]
        return {"step": job.step, "tokens": package["tokens"], "timestamp": time.time(),
                "source": "model_save" if job.scratch else "checkpoint", "blocked_seconds": job.blocked_seconds,
                "seconds": seconds, "final": package["final"], **({"zeroed": True} if zeroed else {})}

    def _tokenizer_file(self, sha256: str) -> Path:
        if self._tokenizer is None:
            from lmforge.trainer.export import tokenizer_files

            self._tokenizer, _ = tokenizer_files(self.config, sha256, self.root / TOKENIZER_CACHE)
        return self._tokenizer

    def _prune(self, newest: int) -> None:
        """Keep the newest weights_keep packages (with purge_requires_upload, also every one the store
        does not hold); remove interrupted packages older than `newest`."""
        for old in committed_steps(self.root)[: -self.keep]:
            if self.purge_requires_upload and not safe_to_delete(self.root, old):
                continue  # the sidecar uploads it first
            (step_dir(self.root, old) / COMMIT_MARKER).unlink(missing_ok=True)  # the marker first, as checkpoints
            shutil.rmtree(step_dir(self.root, old), ignore_errors=True)
        for stale in step_dirs(self.root, committed=False):
            if stale < newest:
                shutil.rmtree(step_dir(self.root, stale), ignore_errors=True)
