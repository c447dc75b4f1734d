"""Prometheus counters of a data-prep process (docs/design.md names), fed from step stats.

Workers of an Indexed Job are batch processes: they push to a Pushgateway when given one
(grouped by job and worker index), and can also serve /metrics while they run."""

from __future__ import annotations

import json

from prometheus_client import Counter, push_to_gateway

from lmforge.common.metrics import new_registry
from lmforge.common.store import Store
from lmforge.dataprep import layout
from lmforge.dataprep.stats import StepStats, merge_stats


class DataprepMetrics:
    def __init__(self):
        self.registry = new_registry()
        self.documents = Counter("lmforge_dataprep_documents", "Documents per stage and outcome (in, kept, dropped)",
                                 ["stage", "outcome"], registry=self.registry)
        self.dropped = Counter("lmforge_dataprep_dropped_documents", "Documents dropped per stage and reason",
                               ["stage", "reason"], registry=self.registry)
        self.bytes = Counter("lmforge_dataprep_bytes", "Text bytes entering each stage", ["stage"],
                             registry=self.registry)
        self.failures = Counter("lmforge_dataprep_worker_failures", "Inputs or tasks that failed",
                                ["phase"], registry=self.registry)

    def record(self, steps: list[StepStats]) -> None:
        for step in steps:
            self.documents.labels(step.name, "in").inc(step.docs_in)
            self.documents.labels(step.name, "kept").inc(step.docs_out)
            self.documents.labels(step.name, "dropped").inc(step.docs_dropped)
            self.bytes.labels(step.name).inc(step.bytes_in)
            for reason, count in step.dropped.items():
                self.dropped.labels(step.name, reason).inc(count)

    def record_inputs(self, store: Store, indices: list[int]) -> None:
        """Counters of finished inputs (from their stats files); an input that could not be
        read counts as a failure of the inputs phase."""
        summaries = [json.loads(store.read_text(layout.input_stats(i))) for i in indices
                     if store.exists(layout.input_stats(i))]
        self.record(merge_stats([s["steps"] for s in summaries]))
        failed = sum(1 for s in summaries if s.get("error"))
        if failed:
            self.failures.labels("inputs").inc(failed)

    def push(self, gateway: str, worker: str) -> None:
        push_to_gateway(gateway, job="lmforge-dataprep", grouping_key={"worker": worker}, registry=self.registry)
