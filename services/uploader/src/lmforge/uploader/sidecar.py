"""`watch`'s loop over what the sidecar does: upload weights packages (small and latency-bound,
so first), upload checkpoints, then let the evaluation launcher ingest, retry and launch.

The uploaders share one stop and one cancel event: SIGTERM stops all of them at once, and the
end of the grace period aborts both. On SIGTERM the draining pass uploads what is committed
(weights, then checkpoints); then the launcher follows its running jobs for what is left of
the grace period. It launches nothing more, except Kubernetes Jobs, which outlive the pod: the
final package, often uploaded only by the draining pass, still gets its evaluation (its result
is ingested by `evals-finalize` or the next sidecar).
"""

from __future__ import annotations

import time

from lmforge.common.checkpoint_layout import committed_steps, step_dir
from lmforge.common.logging import get_logger
from lmforge.uploader.eval_launcher import EvalLauncher
from lmforge.uploader.watcher import CheckpointUploader, read_meta

log = get_logger("uploader")


class Sidecar:
    def __init__(self, checkpoints: CheckpointUploader, weights: CheckpointUploader | None = None,
                 launcher: EvalLauncher | None = None):
        self.checkpoints, self.weights, self.launcher = checkpoints, weights, launcher
        if weights is not None:
            weights.stopping, weights.cancel = checkpoints.stopping, checkpoints.cancel
        self.stopping, self.cancel = checkpoints.stopping, checkpoints.cancel
        self._stop_requested_at: float | None = None

    @property
    def uploaders(self) -> list[CheckpointUploader]:
        return [u for u in (self.weights, self.checkpoints) if u is not None]

    def start(self) -> None:
        for uploader in self.uploaders:
            uploader.start()

    def run_once(self, *, draining: bool = False) -> list[int]:
        """One pass; returns the checkpoint steps uploaded."""
        uploaded = []
        for uploader in self.uploaders:
            steps = uploader.run_once(draining=draining)
            uploaded = steps if uploader is self.checkpoints else uploaded
        if self.launcher is not None and not draining:
            self._launcher_step()
        return uploaded

    def _launcher_step(self) -> None:
        try:
            self.launcher.step()
        except Exception as exc:  # the store or the API server: the next pass tries again
            self.checkpoints.metrics.failures.labels(reason=f"evaluation:{type(exc).__name__}").inc()
            log.error("eval_pass_failed", error=f"{type(exc).__name__}: {exc}")

    def done(self) -> bool:
        """The final checkpoint is in the store, so is the final weights package when the run
        writes packages (the trainer always packages its last step), and no evaluation is running
        or waiting."""
        if not self.checkpoints.final_uploaded():
            return False
        if self.weights is not None and self._weights_expected() and not self.weights.final_uploaded():
            return False
        return self.launcher is None or self.launcher.idle()

    def _weights_expected(self) -> bool:
        """The final checkpoint's config turns weights packages on, or some were written."""
        final = committed_steps(self.checkpoints.local_dir)[-1]
        checkpoint = ((read_meta(step_dir(self.checkpoints.local_dir, final)).get("config") or {})
                      .get("checkpoint") or {})
        return bool(checkpoint.get("weights_every") or checkpoint.get("weights_every_minutes")
                    or committed_steps(self.weights.local_dir))

    def run(self, *, exit_when_done: bool = False) -> None:
        while not self.stopping.is_set():
            self.run_once()
            if exit_when_done and self.done():
                log.info("done", reason="the final checkpoint is uploaded" + (
                    " and evaluated" if self.launcher is not None else ""), dest=self.checkpoints.dest.uri)
                if self.launcher is not None:
                    self.launcher.close()
                return
            self.stopping.wait(self.checkpoints.config.poll_seconds)
        if not self.cancel.is_set():
            log.info("drained", steps=self.run_once(draining=True))
        if self.launcher is not None:
            self._launcher_step()  # the results that landed; a Kubernetes Job for the final package
            spent = time.monotonic() - (self._stop_requested_at or time.monotonic())
            self.launcher.drain(max(self.checkpoints.config.grace_seconds - spent, 0))

    def request_stop(self) -> None:
        if self._stop_requested_at is None:
            self._stop_requested_at = time.monotonic()
        if self.launcher is not None:
            self.launcher.request_stop()
        self.checkpoints.request_stop()

    def close(self) -> None:
        for uploader in self.uploaders:
            uploader.close()
