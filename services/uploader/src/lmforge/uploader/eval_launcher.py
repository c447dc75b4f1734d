"""The evaluation branch: a job per uploaded weights package, its result recorded, the best promoted.

The store is the durable state. A weights package is there once `weights/step-N/MANIFEST.json`
is; its evaluation is done once `evals/step-N.json` (the job's result), `evals/step-N.skipped`
or `evals/step-N.failed` is. Each pass lists both, so a restarted sidecar launches nothing
twice (a Kubernetes Job of the same name is followed, not created again) and ingests the
results that landed while it was away.

Launching: at most `max_concurrent` jobs at once, newest package first. The older pending
packages a launch overtakes (no slot left for them) are skipped: a marker, a record, and
lmforge_eval_skipped_checkpoints_total. The run's final package is never skipped. A failed job
is retried once (`<run>-eval-<N>-retry`), then recorded as failed.

Ingesting a result: its score (promotion.score_of), the task metrics and held-out sources that
regressed against their best so far, a `checkpoint_eval` record appended to RUN_DIR/evals.jsonl
(this sidecar is its only writer), and, for a new best, the promotion (promotion.Promoter).
Records are written once per step: a restart reads the file back first.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from lmforge.common.checkpoint_layout import BAD_MARKER, parse_step, step_dir, step_name
from lmforge.common.logging import get_logger
from lmforge.common.store import Store
from lmforge.uploader.config import EvaluationSection
from lmforge.uploader.eval_runners import FAILED, SUCCEEDED, EvalJob, Runner
from lmforge.uploader.manifest import EVALS, MANIFEST, WEIGHTS, remote_step_prefix
from lmforge.uploader.metrics import UploaderMetrics
from lmforge.uploader.promotion import Promoter, best, is_better, read_json, regressed, score_of
from lmforge.uploader.watcher import is_final, read_meta

log = get_logger("uploader")

RECORDS = "evals.jsonl"
KIND = "checkpoint_eval"
RESULT, SKIPPED, FAILED_MARK = ".json", ".skipped", ".failed"


def result_rel(step: int) -> str:
    return f"{EVALS}{step_name(step)}{RESULT}"


def run_name(weights_dir: Path, config: EvaluationSection) -> str:
    return config.run or Path(weights_dir).resolve().parent.name


class EvalLauncher:
    def __init__(self, dest: Store, weights_dir: Path, config: EvaluationSection, runner: Runner | None,
                 promoter: Promoter, metrics: UploaderMetrics | None = None):
        """`runner` None: ingest and promote only (evals-finalize)."""
        self.dest, self.weights_dir, self.config, self.runner = dest, Path(weights_dir), config, runner
        self.promoter = promoter
        self.metrics = metrics or UploaderMetrics()
        self.run = run_name(self.weights_dir, config)
        self.records_path = self.weights_dir.parent / RECORDS
        self.stopping = threading.Event()  # SIGTERM: launch nothing more
        self.results: dict[int, dict] = {}  # ingested results
        self.recorded: set[int] = set()  # steps with a record (result, skipped or failed)
        self.running: dict[int, tuple[EvalJob, object]] = {}
        self.pending: list[int] = []  # packages waiting for a slot, after the last pass
        self.best: tuple[int, float] | None = None
        self._cut_line = False
        self._load_records()

    def _load_records(self) -> None:
        try:
            text = self.records_path.read_text()
        except FileNotFoundError:
            return
        self._cut_line = bool(text) and not text.endswith("\n")  # the next record starts on a line of its own
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash: its step is recorded again from the store
            if not isinstance(record, dict) or record.get("kind") != KIND or not isinstance(record.get("step"), int):
                continue
            self.recorded.add(record["step"])
            if not record.get("skipped") and not record.get("failed"):
                self.results[record["step"]] = record
        self.best = best(self.results, self.config.score, self.config.mode)
        if self.best is not None:
            self.metrics.eval_promoted_step.set(self.best[0])

    # -- the store's view ----------------------------------------------------------------

    def _state(self) -> tuple[list[int], dict[int, set[str]]]:
        """(weights steps published in the store, not marked BAD; {step: its markers in evals/})."""
        published, bad = set(), set()
        for rel in self.dest.listing(f"{WEIGHTS}/"):
            parts = rel.split("/")
            if len(parts) == 3 and (step := parse_step(parts[1])) is not None:
                if parts[2] == MANIFEST:
                    published.add(step)
                elif parts[2] == BAD_MARKER:
                    bad.add(step)
        marks: dict[int, set[str]] = {}
        for rel in self.dest.listing(EVALS):
            name = rel[len(EVALS):]
            for suffix in (RESULT, SKIPPED, FAILED_MARK):
                if name.endswith(suffix) and (step := parse_step(name[: -len(suffix)])) is not None:
                    marks.setdefault(step, set()).add(suffix)
        return sorted(published - bad), marks

    # -- one pass ------------------------------------------------------------------------

    def step(self) -> None:
        """Ingest what finished, retry or record what failed, launch what has a slot."""
        published, marks = self._state()
        self._poll()
        self._ingest_present(marks)
        if self.runner is None:
            return
        waiting = [s for s in published if s not in self.recorded and s not in self.running and not marks.get(s)]
        self.pending = waiting
        if not self._may_launch():
            return
        free = self.config.max_concurrent - len(self.running)
        newest = sorted(waiting, reverse=True)
        launch, rest = newest[: max(free, 0)], newest[max(free, 0):]
        for step in launch:
            self._launch(EvalJob(self.run, step, self._package(step), self.dest.join(result_rel(step))))
        if launch:
            for step in rest:
                if step < max(launch) and not is_final(read_meta(step_dir(self.weights_dir, step))):
                    self._skip(step)
        self.pending = [s for s in waiting if s not in self.running and s not in self.recorded]
        self.metrics.eval_jobs_running.set(len(self.running))

    def _package(self, step: int) -> str:
        return self.dest.join(remote_step_prefix(step, WEIGHTS).rstrip("/"))

    def _launch(self, job: EvalJob) -> None:
        try:
            handle = self.runner.launch(job)
        except Exception as exc:  # the API server or a bad command: counted as the job failing
            log.error("eval_launch_failed", step=job.step, attempt=job.attempt, error=f"{type(exc).__name__}: {exc}")
            self._job_failed(job)
            return
        self.running[job.step] = (job, handle)
        log.info("eval_launched", step=job.step, job=job.name, attempt=job.attempt, package=job.package)

    def _poll(self) -> None:
        for step, (job, handle) in list(self.running.items()):
            try:
                outcome = self.runner.outcome(handle)
            except Exception as exc:  # asked again on the next pass
                log.warning("eval_poll_failed", step=step, job=job.name, error=f"{type(exc).__name__}: {exc}")
                continue
            if outcome is None:
                continue
            del self.running[step]
            result = read_json(self.dest, result_rel(step)) if outcome == SUCCEEDED else None
            if result is None:
                if outcome == SUCCEEDED:
                    log.error("eval_result_missing", step=step, job=job.name, expected=self.dest.join(result_rel(step)))
                self._job_failed(job)
                continue
            self.metrics.eval_jobs.labels(outcome=SUCCEEDED).inc()
            self.ingest(step, result)
        self.metrics.eval_jobs_running.set(len(self.running))

    def _may_launch(self) -> bool:
        """Until SIGTERM; after it too when the jobs outlive the sidecar (Kubernetes Jobs): the
        final package, uploaded by the draining pass, still gets its evaluation."""
        return not self.stopping.is_set() or self.runner.outlives_sidecar

    def _job_failed(self, job: EvalJob) -> None:
        if not self._may_launch():  # ended with the sidecar (a local process): the next sidecar runs it again
            log.warning("eval_job_interrupted", step=job.step, job=job.name, action="left to the next sidecar")
            return
        if job.attempt == 1:
            log.warning("eval_job_failed", step=job.step, job=job.name, action="retrying once")
            self._launch(EvalJob(job.run, job.step, job.package, job.out, attempt=2))
            return
        self.metrics.eval_jobs.labels(outcome=FAILED).inc()
        log.error("eval_job_failed", step=job.step, job=job.name, action="recorded as failed")
        self.dest.put_bytes(f"{EVALS}{step_name(job.step)}{FAILED_MARK}", job.name.encode())
        self._append({"kind": KIND, "step": job.step, "timestamp": time.time(), "failed": True, "skipped": False})

    def _skip(self, step: int) -> None:
        self.dest.put_bytes(f"{EVALS}{step_name(step)}{SKIPPED}", b"overtaken by a newer package")
        self.metrics.eval_skipped.inc()
        log.info("eval_skipped", step=step, reason="a newer package took the free job slot")
        self._append({"kind": KIND, "step": step, "timestamp": time.time(), "skipped": True})

    def _ingest_present(self, marks: dict[int, set[str]]) -> None:
        """Results and markers in the store without a record here (a restart, or finalize)."""
        for step in sorted(marks):
            if step in self.recorded or step in self.running:
                continue
            if RESULT in marks[step] and (result := read_json(self.dest, result_rel(step))) is not None:
                self.ingest(step, result)
            elif SKIPPED in marks[step]:
                self._append({"kind": KIND, "step": step, "timestamp": time.time(), "skipped": True})
            elif FAILED_MARK in marks[step]:
                self._append({"kind": KIND, "step": step, "timestamp": time.time(), "failed": True, "skipped": False})

    # -- a result ------------------------------------------------------------------------

    def ingest(self, step: int, result: dict) -> dict:
        """Score `result`, promote it when it is a new best, append its record; returns the record."""
        score = score_of(result, self.config.score)
        worse = regressed(step, result, self.results, self.config.score_drop, self.config.loss_rise)
        self.results[step] = result
        promoted = False
        if is_better(score, self.best[1] if self.best else None, self.config.mode):
            try:
                promoted = self.promoter.promote(step, score, remote_step_prefix(step, WEIGHTS)) is not None
                self.best = (step, score)
                self.metrics.eval_promoted_step.set(step)
            except Exception as exc:  # evals-finalize promotes the best again
                self.metrics.failures.labels(reason="promotion").inc()
                log.error("promotion_failed", step=step, error=f"{type(exc).__name__}: {exc}")
        record = {"kind": KIND, "step": step, "tokens": result.get("tokens"), "timestamp": time.time(),
                  "package": result.get("package") or self._package(step), "heldout": result.get("heldout") or {},
                  "tasks": result.get("tasks") or {}, "score": score, "best_step": self.best[0] if self.best else None,
                  "promoted": promoted, "skipped": False, "regressed": worse}
        self._append(record)
        log.info("eval_ingested", step=step, score=score, best_step=record["best_step"], promoted=promoted,
                 regressed=worse)
        return record

    def _append(self, record: dict) -> None:
        self.recorded.add(record["step"])
        self.records_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.records_path, "a") as fh:
            fh.write(("\n" if self._cut_line else "") + json.dumps(record) + "\n")
        self._cut_line = False

    # -- the end -------------------------------------------------------------------------

    def pinned(self) -> set[int]:
        """Weights steps the store must keep for now: those being evaluated or waiting to be."""
        return set(self.running) | set(self.pending)

    def idle(self) -> bool:
        """Nothing running and nothing waiting for a slot (after the last pass)."""
        return not self.running and not self.pending

    def promote_best(self) -> dict | None:
        """Promote the best ingested result (idempotent: a copy and pointer already in place are
        kept); best.json names it. Returns best.json's content."""
        found = best(self.results, self.config.score, self.config.mode)
        if found is not None:
            self.promoter.promote(found[0], found[1], remote_step_prefix(found[0], WEIGHTS))
            self.best = found
            self.metrics.eval_promoted_step.set(found[0])
        return self.promoter.current()

    def finalize(self) -> dict | None:
        """`evals-finalize`: ingest every result and marker in the store, promote the best, write
        best.json. Idempotent: a second run appends no record and leaves the pointer as it is."""
        _published, marks = self._state()
        self._ingest_present(marks)
        return self.promote_best()

    def request_stop(self) -> None:
        self.stopping.set()

    def drain(self, seconds: float, poll_seconds: float = 0.5) -> None:
        """SIGTERM: launch nothing more (but see _may_launch); follow the jobs running for up to `seconds`, then leave
        them (a Kubernetes Job runs on; evals-finalize ingests its result) or stop them
        (a local process)."""
        self.stopping.set()
        deadline = time.monotonic() + seconds
        while self.running and time.monotonic() < deadline:
            self._poll()
            if self.running:
                time.sleep(min(poll_seconds, max(deadline - time.monotonic(), 0)))
        if self.running:
            log.warning("eval_jobs_left_running", steps=sorted(self.running),
                        action="evals-finalize ingests their results")
        self.close()

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()

