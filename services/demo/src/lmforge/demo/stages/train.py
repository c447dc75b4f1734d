"""Step 4: the trainer (torchrun, FSDP over gloo) with the uploader sidecar beside it, as in the
PyTorchJob's pod, against the local S3 store; one failure on purpose and the recovery a restarted
pod goes through:

1. attempt 1 trains until it is SIGKILLed at `interrupt_at` (the trainer's fault injection), while
   the sidecar uploads each committed checkpoint;
2. the pod is gone: the sidecar gets SIGTERM (it finishes uploading what is committed) and the
   checkpoints on the pod's volume are deleted;
3. the restore init container (`lmforge-uploader restore`) brings back the newest checkpoint the
   store holds, and attempt 2 resumes from it to the last step, its sidecar uploading until done.

Both attempts log to the run's one metrics.jsonl, each record with its `attempt`. Attempt 2
recomputes the steps between the restored checkpoint and the kill; their losses must equal
attempt 1's exactly (batches are a pure function of seed and step, and the optimizer state comes
back with the weights). The trainer draws the run's report.html from that file.

With `weights_every`, the trainer also writes a weights-only package every so many steps; the
sidecar uploads each and runs its evaluation job (lmforge.demo.stages.evaluation), records the
scores in RUN_DIR/evals.jsonl and points the model pointer at the best. The last package is
zeroed on purpose (`break_last_weights`): its held-out loss regresses and it is not promoted."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lmforge.common.checkpoint_layout import committed_steps, step_name
from lmforge.demo.config import TrainSection
from lmforge.demo.processes import StepFailed, Supervisor
from lmforge.demo.stages.evaluation import last_weights_step, write_continuation_task, write_uploader_config
from lmforge.demo.stages.storage import s3_env
from lmforge.trainer.metrics_file import EVALS_FILE, by_attempt, latest_per_step, read_checkpoint_evals, read_records
from lmforge.trainer.report_html import REPORT_FILE

RUN_PREFIX = "runs/demo"


@dataclass
class TrainingOutcome:
    run_dir: Path  # metrics.jsonl (both attempts), report.html, checkpoints/ (attempt 2's)
    destination: str  # s3://BUCKET/runs/demo
    interrupted_at: int
    killed_by: str  # the signal that ended attempt 1, from torchrun's failure summary
    restored_step: int
    compared_steps: list[int]
    max_loss_difference: float
    steps: list[dict] = field(default_factory=list)  # each step once, the newest attempt's record
    evals: list[dict] = field(default_factory=list)
    uploaded_steps: list[int] = field(default_factory=list)
    checkpoint_evals: list[dict] = field(default_factory=list)  # evals.jsonl: one record per weights package
    zeroed_step: int | None = None  # the weights package broken on purpose
    best: dict | None = None  # evals/best.json: the promoted package

    @property
    def identical(self) -> bool:
        return bool(self.compared_steps) and self.max_loss_difference == 0.0

    @property
    def final_loss(self) -> float:
        return self.steps[-1]["loss"]

    @property
    def final_val_loss(self) -> float | None:
        return self.evals[-1]["val_loss"] if self.evals else None

    @property
    def report(self) -> Path:
        return self.run_dir / REPORT_FILE

    @property
    def tokens_per_second(self) -> float:
        """Median over the run's steps (the first steps after a start are slower)."""
        rates = sorted(r["tokens_per_second"] for r in self.steps)
        return rates[len(rates) // 2]

    @property
    def checkpoint_uris(self) -> list[str]:
        return [f"{self.destination}/checkpoints/{step_name(s)}/" for s in self.uploaded_steps]


def torchrun_command(train: TrainSection, data_dir: Path, run_dir: Path, metrics_port: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={train.nproc}",
            "--max-restarts=0", "-m", "lmforge.trainer", f"data.sources=[{{path: {data_dir}}}]",
            f"model.preset={train.preset}", f"parallel.mode={'fsdp' if train.nproc > 1 else 'none'}",
            f"steps={train.steps}", f"data.seq_len={train.seq_len}", f"data.batch_size={train.batch_size}",
            f"checkpoint.every={train.checkpoint_every}", f"eval_every={train.eval_every}", "log_every=1",
            f"run_dir={run_dir}", f"metrics.port={metrics_port}", "device=cpu",
            *([f"checkpoint.weights_every={train.weights_every}"] if train.weights_every else []),
            *recipe_overrides(train)]


def recipe_overrides(train: TrainSection) -> list[str]:
    """The trainer settings of train.recipe: none for `plain`; for `curriculum`, a schedule (lmforge.trainer.
    schedule) whose stages fall on whole steps of the demo's global batch."""
    if train.recipe == "plain":
        return []
    batch_tokens = train.nproc * train.batch_size * train.seq_len
    long_from, anneal_from = train.steps // 2, train.steps - train.steps // 5  # WSD decays the last 20%
    return [f"schedule=[{{name: short, global_batch_tokens: {batch_tokens}}}, "
            f"{{name: long, start_tokens: {long_from * batch_tokens}, seq_len: {2 * train.seq_len}, "
            "rope_theta: 40000, document_masking: true}, "
            f"{{name: anneal, start_tokens: {anneal_from * batch_tokens}}}]",
            "optim.schedule=wsd", "optim.decay_fraction=0.2"]


def uploader_command(checkpoints: Path, destination: str, metrics_port: int, exit_when_done: bool,
                     evaluation: Path | None = None) -> list[str]:
    """The sidecar; with `evaluation` (its config file) it also uploads RUN_DIR/weights and evaluates them."""
    weights = ["--weights-dir", str(checkpoints.parent / "weights"), "--config", str(evaluation)] if evaluation else []
    return [sys.executable, "-m", "lmforge.uploader", "watch", "--dir", str(checkpoints), "--dest", destination,
            *weights, "--set", f"metrics_port={metrics_port}", "--set", "poll_seconds=0.5",
            *(["--exit-when-done"] if exit_when_done else [])]


def train_with_interruption(supervisor: Supervisor, train: TrainSection, data_dir: Path, out: Path,
                            s3_endpoint: str, trainer_port: int, uploader_port: int, pushgateway: str = "",
                            note: Callable[[str], None] = lambda _: None) -> TrainingOutcome:
    destination = f"s3://{train.bucket}/{RUN_PREFIX}"
    storage = s3_env(s3_endpoint)
    trainer_env = {**storage, "OMP_NUM_THREADS": "1"}
    run_dir = out / "run"
    checkpoints, metrics = run_dir / "checkpoints", run_dir / "metrics.jsonl"
    evaluation = None
    if train.weights_every:
        tasks = write_continuation_task(data_dir, out / "evaluation" / "tasks", questions=24)
        evaluation = write_uploader_config(out / "evaluation" / "uploader.yaml", train, data_dir, tasks, pushgateway,
                                           s3_endpoint)
    zeroed = last_weights_step(train) if train.break_last_weights else None

    def tick() -> None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            last = read_records(metrics, "step")[-1]
            note(f"step {last['step'] + 1}/{train.steps}: loss {last['loss']:.3f}, "
                 f"{last['tokens_per_second']:,.0f} tokens/s")
    checkpoints.mkdir(parents=True)

    supervisor.start("uploader", uploader_command(checkpoints, destination, uploader_port, False, evaluation),
                     storage)
    code = supervisor.run("train-attempt-1", torchrun_command(train, data_dir, run_dir, trainer_port),
                          {**trainer_env, "LMFORGE_TRAINER_KILL_AT_STEP": str(train.interrupt_at)},
                          expect_failure=True, tick=tick)
    if code == 0:
        raise StepFailed(f"attempt 1 was meant to be killed at step {train.interrupt_at} but finished")
    killed = killed_by(supervisor.log_path("train-attempt-1").read_text(errors="replace"))
    logged = by_attempt(read_records(metrics)).get(1, [])
    reached = logged[-1]["step"] + 1 if logged else 0
    if killed != "SIGKILL" or reached != train.interrupt_at:
        ended = f"by {killed}" if killed else "with an exit code of its own"
        raise StepFailed(f"attempt 1 was meant to be SIGKILLed at step {train.interrupt_at} (fault injection), but "
                         f"its last logged step is {reached - 1} and its first failed rank ended {ended} (torchrun "
                         f"exited {code})\n{supervisor.tail('train-attempt-1')}")
    note(f"attempt 1 killed by {killed} at step {reached} (the trainer's fault injection; torchrun then exits {code}); "
         "the pod is gone: the sidecar uploads what is committed and stops, the pod's checkpoints are lost")
    supervisor.stop("uploader", timeout=120)  # SIGTERM: it uploads what is committed, then exits
    # The checkpoints were on the pod's own volume: gone with it, so attempt 2 starts from what the
    # store holds. metrics.jsonl stays: it is the run's log, kept across attempts as the experiment
    # tracker's run is (and on a cluster with training.checkpoints.persistentVolumeClaim, where it
    # sits beside the checkpoints), so both attempts are compared and drawn from one file.
    shutil.rmtree(checkpoints)
    checkpoints.mkdir()
    supervisor.run("restore", [sys.executable, "-m", "lmforge.uploader", "restore", "--src", destination,
                               "--dir", str(checkpoints)], storage)
    restored = committed_steps(checkpoints)
    if not restored:
        raise StepFailed(f"no checkpoint was uploaded to {destination} before step {train.interrupt_at}: "
                         f"nothing to resume from\n{supervisor.tail('uploader')}")

    note(f"restored step {restored[-1]} from {destination}; attempt 2 resumes from it")
    supervisor.start("uploader", uploader_command(checkpoints, destination, uploader_port, True, evaluation),
                     storage)
    zero = {"LMFORGE_TRAINER_ZERO_WEIGHTS_AT_STEP": str(zeroed)} if zeroed is not None else {}
    supervisor.run("train-attempt-2", torchrun_command(train, data_dir, run_dir, trainer_port),
                   {**trainer_env, **zero}, tick=tick)
    if supervisor.wait("uploader", timeout=600) != 0:
        raise StepFailed(f"the uploader failed after the last step\n{supervisor.tail('uploader')}")
    best = None
    if evaluation is not None:  # what the sidecar's last pass left: every result ingested, the best promoted
        supervisor.run("evals-finalize", [sys.executable, "-m", "lmforge.uploader", "evals-finalize", "--dest",
                                          destination, "--weights-dir", str(run_dir / "weights"),
                                          "--config", str(evaluation)], storage)
        best = read_best(destination, storage)
    outcome = _outcome(train, run_dir, destination, killed, restored[-1], storage)
    outcome.zeroed_step, outcome.best = zeroed, best
    return outcome


def killed_by(torchrun_log: str) -> str | None:
    """The signal that ended the first rank to fail ("SIGKILL"), from torchrun's failure summary
    (`Root Cause` … `exitcode  : -9`); None when that rank exited with a code of its own.
    torchrun itself exits 1 whatever ended its workers."""
    root_cause = torchrun_log.rsplit("Root Cause", 1)[-1]
    match = re.search(r"exitcode\s*:\s*(-?\d+)", root_cause)
    if match is None or int(match.group(1)) >= 0:
        return None
    return signal.Signals(-int(match.group(1))).name


def _outcome(train: TrainSection, run_dir: Path, destination: str, killed: str, restored: int,
             storage: dict[str, str]) -> TrainingOutcome:
    records = read_records(run_dir / "metrics.jsonl")
    attempts = by_attempt(records, "step")
    before = {r["step"]: r["loss"] for r in attempts.get(1, [])}
    after = {r["step"]: r["loss"] for r in attempts.get(2, [])}
    compared = sorted(s for s in before if s > restored and s in after)
    difference = max((abs(before[s] - after[s]) for s in compared), default=float("nan"))
    outcome = TrainingOutcome(run_dir, destination, train.interrupt_at, killed, restored, compared, difference,
                              latest_per_step(records), latest_per_step(records, "eval"),
                              uploaded_steps(destination, storage), read_checkpoint_evals(run_dir / EVALS_FILE))
    if not outcome.identical:
        raise StepFailed(f"the resumed run's losses differ from attempt 1's after step {restored}: "
                         f"max difference {difference} over steps {compared}")
    return outcome


def read_best(destination: str, storage: dict[str, str]) -> dict | None:
    """The store's evals/best.json (the promoted package), None when no result was ingested."""
    from lmforge.demo.stages.storage import demo_store

    store = demo_store(destination, storage)
    try:
        data = store.get_bytes("evals/best.json")
        return json.loads(data) if data is not None else None
    finally:
        store.close()


def uploaded_steps(destination: str, storage: dict[str, str]) -> list[int]:
    """The steps whose checkpoint is complete in the store (its manifest, written last, is there)."""
    from lmforge.common.checkpoint_layout import parse_step
    from lmforge.demo.stages.storage import demo_store
    from lmforge.uploader.manifest import MANIFEST

    store = demo_store(destination, storage)
    try:
        listed = store.list("checkpoints/")
    finally:
        store.close()
    steps = set()
    for rel in listed:
        parts = rel.split("/")
        if len(parts) == 3 and parts[2] == MANIFEST and (step := parse_step(parts[1])) is not None:
            steps.add(step)
    return sorted(steps)
