"""The uploader's Prometheus metrics (docs/design.md names). The gauges are absent until the
sidecar knows their value: the last uploaded step once it has read the store (-1: the store has
none), pending checkpoints after its first pass, the lag after its first upload. A placeholder
read at a restart would count as a change in LmforgeCheckpointUploadStalled."""

from __future__ import annotations

import copy

from prometheus_client import Counter, Gauge, Histogram

from lmforge.common.metrics import AbsentUntilSetGauge, new_registry, serve_metrics


class UploaderMetrics:
    def __init__(self):
        self.registry = r = new_registry()
        self.uploaded_bytes = Counter("lmforge_uploader_uploaded_bytes", "Checkpoint bytes uploaded", registry=r)
        self.failures = Counter("lmforge_uploader_failures", "Checkpoint uploads that failed (retried later)",
                                ["reason"], registry=r)
        self.upload_seconds = Histogram("lmforge_uploader_upload_seconds", "Time to upload one checkpoint",
                                        buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 2400, 3600), registry=r)
        self.last_uploaded_step = AbsentUntilSetGauge(
            "lmforge_uploader_last_uploaded_step",
            "Step of the newest checkpoint whose manifest is in the store (-1: none)", r)
        self.lag_seconds = AbsentUntilSetGauge("lmforge_uploader_lag_seconds",
                                               "Commit marker to manifest, for the last uploaded checkpoint", r)
        self.pending = AbsentUntilSetGauge("lmforge_uploader_pending_checkpoints",
                                           "Committed checkpoints not yet uploaded", r)
        # The evaluation branch (eval_launcher.py).
        self.eval_jobs_running = Gauge("lmforge_eval_jobs_running", "Checkpoint evaluation jobs running", registry=r)
        self.eval_jobs = Counter("lmforge_eval_jobs", "Checkpoint evaluation jobs finished, by outcome (a failed "
                                 "one counts once, after its retry)", ["outcome"], registry=r)
        for outcome in ("succeeded", "failed"):  # both series from the start: increase() sees the first one
            self.eval_jobs.labels(outcome=outcome)
        self.eval_skipped = Counter("lmforge_eval_skipped_checkpoints", "Weights packages not evaluated: "
                                    "overtaken by a newer one while every job slot was busy", registry=r)
        self.eval_promoted_step = AbsentUntilSetGauge(
            "lmforge_eval_promoted_step", "Step of the best evaluated checkpoint (promoted unless evaluation.promote "
            "is off)", r)
        self.server = None

    def for_weights(self) -> UploaderMetrics:
        """The weights uploader's view: the same bytes and failure counters and evaluation series,
        but its own unexported upload gauges, so lmforge_uploader_last_uploaded_step, _lag_seconds
        and _pending_checkpoints (and the alerts on them) stay the checkpoints'."""
        view = copy.copy(self)
        private = new_registry()
        view.upload_seconds = Histogram("lmforge_uploader_upload_seconds", "", registry=private)
        view.last_uploaded_step = AbsentUntilSetGauge("lmforge_uploader_last_uploaded_step", "", private)
        view.lag_seconds = AbsentUntilSetGauge("lmforge_uploader_lag_seconds", "", private)
        view.pending = AbsentUntilSetGauge("lmforge_uploader_pending_checkpoints", "", private)
        return view

    def serve(self, port: int) -> int:
        self.server = serve_metrics(self.registry, port)
        return self.server.server_port

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
