"""The whole platform on one machine, stage by stage (the seven stages of `make demo`); every
service runs as its own process under a Supervisor, and stays up until close()."""

from __future__ import annotations

import platform as host
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from lmforge.common.checkpoint_layout import committed_steps, step_dir
from lmforge.dataprep.layout import TRACE_INDEX
from lmforge.demo.config import DemoConfig
from lmforge.demo.processes import Supervisor, free_port, stop_recorded
from lmforge.demo.progress import Progress
from lmforge.demo.stages.corpus import make_corpus
from lmforge.demo.stages.data import read_prepared, run_data_pipeline
from lmforge.demo.stages.evaluation import REGRESSION_ALERT, evaluation_line, evaluation_summary, wait_for_alert
from lmforge.demo.stages.observe import Monitoring, check_dashboards, start_monitoring
from lmforge.demo.stages.serve import (
    MODEL_NAME,
    complete,
    export_package,
    latency_means,
    run_canary,
    start_server,
    write_eval_set,
)
from lmforge.demo.stages.storage import start_s3
from lmforge.demo.stages.trace import trace_passage
from lmforge.demo.stages.train import train_with_interruption
from lmforge.demo.staging import discard_staging, staged
from lmforge.demo.summary import render, write_summary

STEPS = 7


class LocalPlatform:
    def __init__(self, config: DemoConfig, stream: TextIO = sys.stdout):
        self.config = config
        self.workdir = Path(config.workdir).resolve()
        self.progress = Progress(STEPS, stream)
        self.supervisor: Supervisor | None = None
        self.monitoring: Monitoring | None = None
        self.summary: dict[str, Any] = {}
        self.ports = {"inference": config.serve.port or free_port(), "trainer": free_port(),
                      "uploader": free_port(), "s3": free_port(),
                      "prometheus": config.observe.prometheus_port or free_port(),
                      "pushgateway": config.observe.pushgateway_port or free_port()}

    def run(self) -> dict[str, Any]:
        """Steps 1–7; the servers stay up afterwards (close() stops them). Returns the summary."""
        self._prepare_workdir()
        self._setup()
        corpus = self._corpus_and_data()
        training = self._train()
        serving = self._serve(training)
        dashboards = self._observe(training)
        self.summary = self._summarize(corpus, training, serving, dashboards)
        return self.summary

    def close(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop_all()
        discard_staging(self.workdir)

    # -- the stages -----------------------------------------------------------------------------

    def _prepare_workdir(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        leftovers = stop_recorded(self.workdir)
        if leftovers:
            self.progress.note(f"stopped what an earlier demo left running: {', '.join(leftovers)}")
        discard_staging(self.workdir)
        for live in ("logs", "observe", "serve"):  # the previous run's server state, not artifacts
            shutil.rmtree(self.workdir / live, ignore_errors=True)
        self.supervisor = Supervisor(self.workdir)

    def _setup(self) -> None:
        import torch

        with self.progress.stage(1, "Set-up"):
            self.progress.note(f"Python {host.python_version()}, torch {torch.__version__}, the services installed "
                               f"in {Path(sys.executable).parent.parent} (make setup); outputs in {self.workdir}")

    def _corpus_and_data(self) -> dict[str, Any]:
        data = self.config.data
        with staged(self.workdir, "data") as staging:
            with self.progress.stage(2, "Corpus" + (" (generated WET files)" if data.crawl == "sample"
                                                   else f" ({data.crawl}, downloaded)")):
                corpus = make_corpus(self.supervisor, data, staging / "data")
                self.progress.note(f"{len(corpus.files)} WET files: {corpus.text_bytes / 1e6:.1f} MB of text "
                                   f"({corpus.compressed_bytes / 1e6:.1f} MB gzipped) in {self.workdir / 'data/wet'}")
            with self.progress.stage(3, f"Data pipeline through kfp.local ({data.workers} data-prep workers)"):
                self.monitoring = start_monitoring(self.supervisor, self.config.observe, self.workdir / "observe",
                                                   self.ports)
                self.progress.note(f"first, monitoring: Prometheus {self.monitoring.prometheus}, Pushgateway "
                                   f"{self.monitoring.pushgateway}")
                run_data_pipeline(self.supervisor, data, staging, self.monitoring.pushgateway)
        prepared = read_prepared(self.workdir / "data")
        totals = prepared.report["totals"]
        self.progress.note(f"{prepared.report['inputs']['records']:,} documents → {totals['kept_docs']:,} kept, "
                           f"{totals['output_tokens']:,} tokens; report: {self.workdir / 'data/report.html'}")
        return {"wet_files": len(corpus.files), "text_bytes": corpus.text_bytes,
                "compressed_bytes": corpus.compressed_bytes, "documents": prepared.report["inputs"]["records"],
                "kept_docs": totals["kept_docs"], "tokens": totals["output_tokens"],
                "shards": totals["train_shards"] + totals["val_shards"], "funnel": prepared.funnel,
                "path": str(prepared.path)}

    def _train(self) -> dict[str, Any]:
        train = self.config.train
        mode = "FSDP" if train.nproc > 1 else "one process"
        with self.progress.stage(4, f"Training: {train.preset} preset, torchrun {train.nproc} processes ({mode}), "
                                   f"{train.steps} steps, the uploader sidecar beside it"):
            endpoint = start_s3(self.supervisor, self.ports["s3"], train.bucket)
            self.progress.note(f"S3 (moto) at {endpoint}, bucket {train.bucket}; attempt 1 will be killed at step "
                               f"{train.interrupt_at}")
            with staged(self.workdir, "train") as staging:
                outcome = train_with_interruption(self.supervisor, train, self.workdir / "data", staging / "train",
                                                  endpoint, self.ports["trainer"], self.ports["uploader"],
                                                  self.monitoring.pushgateway, self.progress.note)
            self.progress.note(f"attempt 2 recomputed steps {outcome.compared_steps[0]}–{outcome.compared_steps[-1]} "
                               "with losses identical to attempt 1's")
            run_dir = self.workdir / "train" / outcome.run_dir.name  # where the step's output now is
            self.progress.note(f"final train loss {outcome.final_loss:.3f}, val loss {outcome.final_val_loss:.3f}, "
                               f"{outcome.tokens_per_second:,.0f} tokens/s; {len(outcome.uploaded_steps)} "
                               f"checkpoints in S3; training report: {run_dir / outcome.report.name}")
            evaluation = evaluation_summary(outcome)
            if evaluation["packages"]:
                self.progress.note(evaluation_line(evaluation))
        return {"preset": train.preset, "nproc": train.nproc, "mode": mode, "steps": train.steps,
                "final_loss": outcome.final_loss, "final_val_loss": outcome.final_val_loss,
                "tokens_per_second": outcome.tokens_per_second, "interrupted_at": outcome.interrupted_at,
                "killed_by": outcome.killed_by,
                "restored_step": outcome.restored_step, "compared_steps": outcome.compared_steps,
                "max_loss_difference": outcome.max_loss_difference, "identical": outcome.identical,
                "checkpoint_uris": outcome.checkpoint_uris, "uploaded_steps": outcome.uploaded_steps,
                "destination": outcome.destination, "s3_endpoint": endpoint, "run_dir": str(run_dir),
                "metrics": str(run_dir / "metrics.jsonl"), "report": str(run_dir / outcome.report.name),
                "evaluation": evaluation}

    def _serve(self, training: dict[str, Any]) -> dict[str, Any]:
        serve = self.config.serve
        with self.progress.stage(5, "Serving: export, lmforge-serve, completions, canary"):
            checkpoints = Path(training["run_dir"]) / "checkpoints"
            final = step_dir(checkpoints, committed_steps(checkpoints)[-1])
            with staged(self.workdir, "model") as staging:
                export_package(self.supervisor, final, staging / "model")
            out = self.workdir / "serve"
            out.mkdir(parents=True, exist_ok=True)
            index = self.workdir / "data" / TRACE_INDEX
            url = start_server(self.supervisor, serve, self.workdir / "model", self.ports["inference"], out,
                               index if self.config.data.trace_index else None)
            self.progress.note(f"model package {self.workdir / 'model'} (from {final.name}; Hugging Face format) "
                               f"served at {url}")
            completions = []
            for index, prompt in enumerate(serve.prompts):
                done = complete(url, serve.api_key, prompt, serve.max_tokens, stream=index == len(serve.prompts) - 1)
                completions.append(asdict(done))
                self.progress.note(f"{'streamed ' if done.streamed else ''}{prompt!r} → {done.text[:60]!r}")
            traced = None
            if self.config.data.trace_index:
                traced = trace_passage(url, serve.api_key, MODEL_NAME, self.workdir / "data", serve.max_tokens)
                self.progress.note(f"traced a training passage to {traced['url']} ({traced['longest']}-token span, "
                                   f"{traced['count']} document(s)); its completion: "
                                   f"{len(traced['completion_spans'])} span(s) found verbatim")
            eval_set = write_eval_set(self.workdir / "data", out / "canary-eval-set.yaml", serve.canary_texts)
            canary = run_canary(self.supervisor, url, out / "api-keys", eval_set, out, self.monitoring.pushgateway)
            self.progress.note(f"canary: {'pass' if canary.passed else 'REGRESSION'} (perplexity "
                               f"{canary.perplexity:.2f}, score {canary.score:.2f}); baseline {canary.baseline}")
        return {"url": url, "model": MODEL_NAME, "api_key": serve.api_key, "completions": completions, "trace": traced,
                **latency_means(url), "canary": {"passed": canary.passed, "perplexity": canary.perplexity,
                                                 "score": canary.score, "baseline": str(canary.baseline),
                                                 "eval_set": str(canary.eval_set)}}

    def _observe(self, training: dict[str, Any]) -> dict[str, Any]:
        with self.progress.stage(6, "Observability: the dashboards' queries against Prometheus"):
            zeroed = training["evaluation"]["zeroed_step"]
            if zeroed is not None and training["evaluation"]["packages"]:
                fired = wait_for_alert(self.monitoring.prometheus, REGRESSION_ALERT, timeout=60)
                training["evaluation"]["alert"] = REGRESSION_ALERT if fired else None
                self.progress.note(f"{REGRESSION_ALERT} {'firing' if fired else 'did NOT fire'} for the zeroed "
                                   f"weights checkpoint of step {zeroed}")
            check = check_dashboards(self.monitoring, self.config.observe,
                                     settle_seconds=2 * _seconds(self.config.observe.scrape_interval) + 1,
                                     page=self.workdir / "observe" / "dashboards.html")
            self.progress.note(f"{len(check.with_data)} panel queries return data"
                               + (f"; {len(check.gpu_only)} GPU-only panels not asked (no GPU)" if check.gpu_only
                                  else ""))
            for empty in check.empty:
                self.progress.note(f"no data: {empty}")
        return asdict(check)

    def _summarize(self, data: dict, training: dict, serving: dict, dashboards: dict) -> dict[str, Any]:
        summary = {"seconds": self.progress.elapsed(), "data": data, "train": training,
                   "serve": {k: v for k, v in serving.items() if k != "canary"}, "canary": serving["canary"],
                   "dashboards": dashboards,
                   "where": {"report": str(self.workdir / "data" / "report.html"),
                             "training_report": training["report"],
                             "metrics": f"{serving['url']}/metrics", "prometheus": self.monitoring.prometheus,
                             "pushgateway": self.monitoring.pushgateway, "logs": str(self.workdir / "logs"),
                             "dashboards": dashboards["page"],
                             "summary": str(self.workdir / "summary.json")}}
        self.progress.header(7, "Summary")
        write_summary(self.workdir / "summary.json", summary)
        self.progress.stream.write("\n" + render(summary))
        self.progress.stream.flush()
        return summary

    def hold(self) -> None:
        """Until interrupted (Ctrl-C, SIGTERM); returns early if a server dies."""
        self.progress.stream.write("\nThe servers stay up until Ctrl-C (or `make demo-stop`).\n")
        self.progress.stream.flush()
        while True:
            dead = self.supervisor.exited()
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while the demo was holding")
            time.sleep(1)


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in ("ms", "s", "m", "h"):
        if duration.endswith(unit):
            return float(duration[: -len(unit)]) * units[unit]
    return float(duration)
