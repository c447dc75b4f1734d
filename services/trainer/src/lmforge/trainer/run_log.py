"""What the training loop logs to: JSON lines on every rank; metrics.jsonl (and report.html drawn
from it), Prometheus and the experiment trackers on rank 0."""

from __future__ import annotations

import os
import time
from contextlib import suppress
from pathlib import Path

from lmforge.common.logging import get_logger
from lmforge.trainer.config import TrainConfig
from lmforge.trainer.metrics import TrainMetrics
from lmforge.trainer.metrics_file import MetricsFile
from lmforge.trainer.parallelize import Dist
from lmforge.trainer.report_html import ReportRefresher
from lmforge.trainer.tracking import open_trackers


class RunLog:
    """One attempt's records. Creating it on rank 0 writes RUN_DIR/config.json and starts the
    metrics endpoint and trackers; close() ends them."""

    def __init__(self, config: TrainConfig, ctx: Dist):
        self.ctx = ctx
        self.log = get_logger("trainer", rank=ctx.rank)
        self.file = self.prometheus = self.trackers = self.report = None
        self.run_dir = Path(config.run_dir)
        self._checkpoint_step: int | None = None
        if not ctx.is_main:
            return
        run_dir = self.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(config.model_dump_json(indent=1))
        self.file = MetricsFile(run_dir / "metrics.jsonl")
        self.report = ReportRefresher(run_dir, self._report_not_written)
        self.prometheus = TrainMetrics()
        if config.metrics.port:
            port = self.prometheus.serve(config.metrics.port)
            self.log.info("metrics_serving", port=port)
        self.trackers = open_trackers(config.tracking, config.model_dump(mode="json"), run_dir)

    def record(self, kind: str, record: dict, *, console: bool = True) -> None:
        if console:
            self.log.info(kind, **record)
        if self.file:
            self.file.write({"kind": kind, **record})
        if self.trackers and kind in ("step", "eval"):
            self.trackers.log(record["step"], {k: v for k, v in record.items() if k != "step"})

    def start(self, resumed_from: int | None, steps: int) -> None:
        """The attempt's first record: the checkpoint it resumed from (None: from scratch)."""
        self._checkpoint_step = resumed_from
        if self.prometheus and resumed_from is not None:
            self.prometheus.last_checkpoint.set(resumed_from)
        if self.file:
            self.log.info("attempt_started", attempt=self.file.attempt, resumed_from=resumed_from)
        first = 0 if resumed_from is None else resumed_from + 1
        restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.record(
            "start",
            {
                "timestamp": time.time(),
                "resumed_from": resumed_from,
                "first_step": first,
                "steps": steps,
                "world_size": self.ctx.world_size,
                "restart_count": restart_count,
            },
            console=False,
        )

    def checkpoint_committed(self, step: int | None) -> None:
        """Called after every step with the newest committed step; records each commit once."""
        if step is None or step == self._checkpoint_step:
            return
        self._checkpoint_step = step
        if self.prometheus:
            self.prometheus.last_checkpoint.set(step)
        self.record("checkpoint", {"step": step, "timestamp": time.time()}, console=False)
        if self.report:
            self.report.request()  # a killed attempt leaves the report as of a recent checkpoint

    def _report_not_written(self, exc: Exception) -> None:  # training goes on regardless
        error = f"{type(exc).__name__}: {exc}"
        self.log.warning("report_not_written", path=str(self.run_dir / "report.html"), error=error)

    def close(self, failed: bool) -> None:
        if self.trackers:
            self.trackers.close("FAILED" if failed else "FINISHED")
        if self.prometheus:
            self.prometheus.close()
        if self.file:
            status = "failed" if failed else "finished"
            try:
                self.record("end", {"timestamp": time.time(), "status": status}, console=False)
            except OSError as exc:  # a full disk must not replace the error that ended the run
                self.log.warning("metrics_not_written", path=str(self.run_dir / "metrics.jsonl"), error=str(exc))
            with suppress(OSError):  # (the same failed write again; the file is closed all the same)
                self.file.close()
            self.report.close()
