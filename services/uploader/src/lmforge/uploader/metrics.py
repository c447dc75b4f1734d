"""The uploader's Prometheus metrics (docs/design.md names). The gauges are absent until the
sidecar knows their value: the last uploaded step once it has read the store (-1: the store has
none), pending checkpoints after its first pass, the lag after its first upload. A placeholder
read at a restart would count as a change in LmforgeCheckpointUploadStalled."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

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
        self.server = None

    def serve(self, port: int) -> int:
        self.server = serve_metrics(self.registry, port)
        return self.server.server_port

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
