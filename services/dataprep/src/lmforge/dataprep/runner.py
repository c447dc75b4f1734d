"""Runs the data-prep phases, locally (a process pool) or as one worker of an Indexed Job.

The parallel phases (inputs, dedup, tokenize, shards) build their task list once (tasks.py); a worker
given indices runs those tasks of it (worker_slice), a local run all of them, and the run's
executor (executor.py: inline, or a pool of spawned processes) runs the ones not yet complete.

Phases and their completion markers (a rerun skips what is complete):
  inputs    per input: kept docs, rejects, signatures, stats,
            dedup keys (one file per key column)                → work/done/input-*
  dedup     per partition (LSH band / URL / content), from its
            column's key files only: edges                      → work/dedup/edges-*.npy
  cluster   per group of dedup partitions: components of their
            edges                                               → work/dedup/forest-*.npz
            then one merge → removed ids per input              → work/stats/global_dedup.json
  tokenizer train or load                                      → tokenizer.json
  tokenize  per input: tokens + index + dedup rejects          → work/done/tokenize-*
  shards    per shard partition (inputs_per_partition inputs):
            shuffle, split, shards, lineage                     → work/shards/partition-*.json
  manifest  every partition's shards                            → manifest.json
  report    report.json + report.html
Nothing after the per-input stage reads more than its own partition's files, except cluster
(every edge: its memory grows with the duplicates, not the documents) and the tokenizer
(its bounded sample). Output does not depend on how many workers or processes ran a phase.
Every process records its part of each phase it worked on (wall-clock, CPU, peak RSS) under
work/timings/ (timings.py); the report adds them up per phase.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from lmforge.common.config import dump_config
from lmforge.common.errors import ConfigError, InputError, StorageError
from lmforge.common.logging import StructLogger, get_logger
from lmforge.common.storage import LocalStore, Store, expand_inputs, input_size, open_store
from lmforge.dataprep import layout
from lmforge.dataprep.config import DataprepConfig
from lmforge.dataprep.dedup_global import PartitionPlan as PartitionPlan  # cli.py sizes dedup slices with it
from lmforge.dataprep.dedup_global import check_minhash_config, merge_clusters, write_minhash_config
from lmforge.dataprep.executor import Executor, local_executor
from lmforge.dataprep.progress import Progress
from lmforge.dataprep.shard_writer import write_manifest
from lmforge.dataprep.steps.reader import BAD_INPUT_PREFIX
from lmforge.dataprep.tasks import Task, cluster_tasks, input_tasks, partition_tasks, tokenize_tasks
from lmforge.dataprep.tasks import shard_tasks as shard_tasks  # cli.py counts shard tasks with it
from lmforge.dataprep.timings import timed_phase
from lmforge.dataprep.tokenize import prepare_tokenizer

T = TypeVar("T", bound=Task)


@dataclass
class Run:
    store: Store
    config: DataprepConfig
    inputs: list[str]
    log: StructLogger = field(default_factory=lambda: get_logger("dataprep"))
    processes: int = 1

    @property
    def n_inputs(self) -> int:
        return len(self.inputs)

    _executor: Executor | None = field(default=None, init=False, repr=False)

    def executor(self) -> Executor:
        """What runs this run's tasks on this machine: inline, or over `processes` processes
        (started once, for every phase of the run, until close())."""
        if self._executor is None:
            self._executor = local_executor(self.store, self.config, self.processes)
        return self._executor

    def close(self) -> None:
        if self._executor is not None:
            self._executor.close()
            self._executor = None

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def worker_slice(n_items: int, worker_index: int, num_workers: int) -> list[int]:
    """Items of one worker (indices into a phase's task list): every num_workers-th, starting
    at worker_index."""
    if num_workers < 1:
        raise ConfigError(f"num_workers must be ≥ 1, got {num_workers}")
    if not 0 <= worker_index < num_workers:
        raise ConfigError(f"worker_index must be in [0, {num_workers}), got {worker_index}")
    return list(range(worker_index, n_items, num_workers))


def _write_or_check(store: Store, rel: str, payload, what: str) -> None:
    text = json.dumps(payload, indent=1, sort_keys=True)
    if store.exists(rel):
        if json.loads(store.read_text(rel)) != json.loads(text):
            raise ConfigError(
                f"{store.join(rel)} records a different {what} than this run's; a data-prep output directory "
                f"belongs to one set of inputs and one config. Use a new --output, or the same {what}."
            )
        return
    store.write_text(rel, text)


def open_run(output: str, config: DataprepConfig | None, input_patterns: list[str] | None,
             processes: int = 1) -> Run:
    """Start or resume a run. With inputs, record them and the config (or check them
    against what is recorded). Without, the global stages run from the output directory
    alone, with the recorded config; a config given explicitly must match it."""
    store = open_store(output)
    if isinstance(store, LocalStore) and store.root.exists() and not store.root.is_dir():
        raise StorageError(f"output {output} is a file, not a directory")
    if input_patterns:
        if config is None:
            raise ConfigError("a run that reads inputs needs a config")
        inputs = expand_inputs(input_patterns)
        _write_or_check(store, layout.INPUTS, inputs, "input list")
        _write_or_check(store, layout.CONFIG, dump_config(config), "config")
        write_minhash_config(store, config.minhash)
    else:
        if not store.exists(layout.INPUTS):
            raise InputError(f"{store.join(layout.INPUTS)} not found: run the per-input stage (with --input) first")
        inputs = json.loads(store.read_text(layout.INPUTS))
        if config is not None:
            _write_or_check(store, layout.CONFIG, dump_config(config), "config")
        config = DataprepConfig.model_validate(json.loads(store.read_text(layout.CONFIG)))
    return Run(store, config, inputs, processes=max(1, processes))


# ------------------------------------------------------------------ running a phase's tasks


def _chosen(tasks: list[T], indices: Iterable[int] | None) -> list[T]:
    """The tasks at `indices` (an Indexed-Job worker's worker_slice), else all of them."""
    return list(tasks) if indices is None else [tasks[i] for i in indices]


def _pending(run: Run, tasks: list[T]) -> list[T]:
    return [task for task in tasks if not run.store.exists(task.done_marker)]


def _run_tasks(run: Run, phase: str, tasks: list[Task], indices: Iterable[int] | None, *, timing: str | None = None,
               unit: str = "inputs", on_result: Callable | None = None, **log_fields) -> list:
    """Run the tasks at `indices` (all when None) that are not complete yet through the run's
    executor: logged, counted as progress and timed as part of `timing` (default: `phase`)."""
    chosen = _chosen(tasks, indices)
    pending = _pending(run, chosen)
    run.log.info("phase_start", phase=phase, tasks=len(chosen), pending=len(pending), **log_fields)
    progress = Progress(run.log, phase, len(pending), unit=unit)

    def done(result) -> None:
        if on_result:
            on_result(result)
        progress.advance()

    with timed_phase(run.store, timing or phase, len(pending)):
        results = run.executor().run(pending, done)
    progress.close()
    return results


# ------------------------------------------------------------------ phases


def run_inputs(run: Run, indices: Iterable[int] | None = None) -> list:
    tasks = input_tasks(run.inputs)
    pending = _pending(run, _chosen(tasks, indices))

    def report(result):
        run.log.info("input_done", input=result.uri, seconds=round(result.seconds, 3),
                     docs_kept=result.docs_kept, peak_rss_bytes=result.peak_rss_bytes)

    return _run_tasks(run, "inputs", tasks, indices, on_result=report,
                      input_bytes=sum(input_size(task.uri) or 0 for task in pending))


def missing_inputs(run: Run) -> list[int]:
    return [i for i in range(run.n_inputs) if not run.store.exists(layout.input_done(i))]


def _require_inputs_done(run: Run) -> None:
    missing = missing_inputs(run)
    if missing:
        names = ", ".join(run.inputs[i] for i in missing[:5])
        raise InputError(f"{len(missing)} input(s) not processed yet (e.g. {names}); run the per-input stage first")


def _require_documents(run: Run) -> None:
    """A run in which no input yielded a single document is an input error, not an empty
    success the trainer finds out about later (`no 'train' shards`)."""
    def stats_of(i: int) -> dict:
        return json.loads(run.store.read_text(layout.input_stats(i)))

    if any(_documents_read(stats_of(i)) for i in range(run.n_inputs)):  # usually stops at the first
        return
    shown = [stats_of(i) for i in range(min(run.n_inputs, 5))]  # every input is a bad one: name a few
    problems = "; ".join(f"{stats['input']} ({_input_problem(stats)})" for stats in shown)
    more = f" and {run.n_inputs - len(shown)} more" if run.n_inputs > len(shown) else ""
    raise InputError(f"no input yielded a single document: {problems}{more}")


def _documents_read(summary: dict) -> int:
    return next((step["docs_out"] for step in summary["steps"] if step["name"] == "read"), 0)


def _input_problem(summary: dict) -> str:
    """What was wrong with one input, in a few words: its error, else its bad-input kinds."""
    if summary.get("error"):
        return summary["error"]
    read = next((step for step in summary["steps"] if step["name"] == "read"), {})
    parts = [f"{key.removeprefix(BAD_INPUT_PREFIX)}: {n}" for key, n in sorted(read.get("counters", {}).items())
             if key.startswith(BAD_INPUT_PREFIX) and n]
    rejected = sum(read.get("dropped", {}).values())
    if rejected:
        parts.append(f"{rejected} record(s) rejected")
    return ", ".join(parts) or "no records"


def run_dedup(run: Run, indices: Iterable[int] | None = None) -> None:
    _require_inputs_done(run)
    _require_documents(run)
    check_minhash_config(run.store, run.config.minhash)
    _run_tasks(run, "dedup", partition_tasks(run.config, run.n_inputs), indices, unit="partitions")


def run_cluster(run: Run, indices: Iterable[int] | None = None) -> dict | None:
    """The cluster tasks at `indices` (all when None: then their merge too, whose summary it returns)."""
    if indices is None and run.store.exists(layout.DEDUP_STATS):
        return json.loads(run.store.read_text(layout.DEDUP_STATS))
    _run_tasks(run, "cluster", cluster_tasks(run.config), indices, timing="dedup", unit="tasks")
    return run_cluster_merge(run) if indices is None else None


def run_cluster_merge(run: Run) -> dict:
    if run.store.exists(layout.DEDUP_STATS):
        return json.loads(run.store.read_text(layout.DEDUP_STATS))
    started = time.perf_counter()
    with timed_phase(run.store, "dedup", 1):
        summary = merge_clusters(run.store, run.config.minhash, run.n_inputs)
        summary["seconds"] = round(time.perf_counter() - started, 4)
        run.store.write_text(layout.DEDUP_STATS, json.dumps(summary, indent=1))
    run.log.info("dedup_clusters", **summary)
    return summary


def run_tokenizer(run: Run) -> dict:
    run_cluster_merge(run)
    with timed_phase(run.store, "tokenizer", 0 if run.store.exists(layout.TOKENIZER_STATS) else 1):
        info = prepare_tokenizer(run.store, run.config, run.n_inputs)
    run.log.info("tokenizer_ready", **info)
    return info


def _tokenizer_info(run: Run) -> dict:
    if not run.store.exists(layout.TOKENIZER_STATS):
        raise InputError("tokenizer not prepared yet: run the tokenizer stage first")
    return json.loads(run.store.read_text(layout.TOKENIZER_STATS))


def run_tokenize(run: Run, indices: Iterable[int] | None = None) -> None:
    _run_tasks(run, "tokenize", tokenize_tasks(_tokenizer_info(run), run.n_inputs), indices)


def run_shards(run: Run, indices: Iterable[int] | None = None) -> dict | None:
    """The shard partitions at `indices` (all when None: then manifest.json too, returned)."""
    if indices is None and run.store.exists(layout.MANIFEST):
        return json.loads(run.store.read_text(layout.MANIFEST))
    missing = [i for i in range(run.n_inputs) if not run.store.exists(layout.tokenize_done(i))]
    if missing:
        raise InputError(f"{len(missing)} input(s) not tokenized yet: run the tokenize stage first")
    _run_tasks(run, "shards", shard_tasks(run.config, _tokenizer_info(run), run.n_inputs), indices,
               unit="partitions")
    return run_manifest(run) if indices is None else None


def run_manifest(run: Run) -> dict:
    if run.store.exists(layout.MANIFEST):
        return json.loads(run.store.read_text(layout.MANIFEST))
    with timed_phase(run.store, "shards", 1):
        manifest = write_manifest(run.store, run.config, run.n_inputs, _tokenizer_info(run), run.inputs)
    run.log.info("shards_written", shards=len(manifest["shards"]), **manifest["totals"])
    return manifest


def run_report(run: Run) -> str:
    from lmforge.dataprep.report import write_report

    run_manifest(run)
    write_report(run)
    path = run.store.join(layout.REPORT_HTML)
    run.log.info("report_written", report=path, json=run.store.join(layout.REPORT_JSON))
    return path


def run_all(run: Run) -> str:
    """Every phase in order, each skipping work already complete."""
    run_inputs(run)
    run_dedup(run)
    run_cluster(run)
    run_tokenizer(run)
    run_tokenize(run)
    run_shards(run)
    return run_report(run)


def default_processes() -> int:
    return max(1, min(os.cpu_count() or 1, 8))
