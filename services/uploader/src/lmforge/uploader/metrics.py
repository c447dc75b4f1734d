"""The uploader's Prometheus metrics (DESIGN.md names)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from lmforge.common.metrics import new_registry, serve_metrics


class UploaderMetrics:
    def __init__(self):
        self.registry = r = new_registry()
        self.uploaded_bytes = Counter("lmforge_uploader_uploaded_bytes", "Checkpoint bytes uploaded", registry=r)
        self.failures = Counter("lmforge_uploader_failures", "Checkpoint uploads that failed (retried later)",
                                ["reason"], registry=r)
        self.upload_seconds = Histogram("lmforge_uploader_upload_seconds", "Time to upload one checkpoint",
                                        buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 2400, 3600), registry=r)
        self.last_uploaded_step = Gauge("lmforge_uploader_last_uploaded_step",
                                        "Step of the newest checkpoint whose manifest is in the store (-1: none)",
                                        registry=r)
        self.last_uploaded_step.set(-1)
        self.lag_seconds = Gauge("lmforge_uploader_lag_seconds",
                                 "Commit marker to manifest, for the last uploaded checkpoint", registry=r)
        self.pending = Gauge("lmforge_uploader_pending_checkpoints", "Committed checkpoints not yet uploaded",
                             registry=r)
        self.server = None

    def serve(self, port: int) -> int:
        self.server = serve_metrics(self.registry, port)
        return self.server.server_port

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
