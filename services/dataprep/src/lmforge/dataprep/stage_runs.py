"""Runs the data-prep stages (stages.py, in its order), locally (a process pool) or as one task
slice of an Indexed Job.

Every split stage builds its task list once; a pod given indices runs its slice of them
(worker_slice of `stage_task_count`), a local run all of them, and the run's executor (executor.py: inline, or a
pool of spawned processes) runs the ones not yet complete. STAGE_RUNS holds one function per
stage of stages.STAGES (a test holds them equal).

Stages and their completion markers (a rerun skips what is complete):
  inputs      per input: kept docs, rejects, stats, dedup keys with
              signatures (one section per dedup partition)            → work/done/input-*
  combine     per (input group, partition range): the group's
              sections in one object                                  → layout.combined_keys
  dedup       per partition, from every group's object: edges         → layout.edges
  components  per round and share of the nodes: connected components
              in rounds (components.py), then removed ids per input   → layout.components_done
              and the summary (finish_components, by the tokenizer)   → work/stats/global_dedup.json
  tokenizer   train or load                                          → tokenizer.json
  tokenize    per input: tokens + index + dedup rejects               → work/done/tokenize-*
  shards      per shard partition (inputs_per_partition inputs):
              shuffle, split, shards, lineage                         → work/shards/partition-*.json
  trace-index per index partition (shard_partitions_per_index shard
              partitions), when trace_index.enabled: the exact-match
              index of their shards (trace_index.py)                  → trace-index/partition-*/entry.json
  report      manifest.json, trace-index/index.json (when enabled),
              report.json + report.html
No task reads more than a bounded number of objects: a dedup task one per input group, a
components task one per task of the round before, the tokenizer its bounded sample. Output does
not depend on how many workers or processes ran a stage. Every process records its part of each
stage it worked on (wall-clock, CPU, peak RSS) under work/timings/ (timings.py); the report adds
them up per stage.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from typing import TypeVar

from lmforge.common.config import dump_config
from lmforge.common.errors import ConfigError, InputError, StorageError
from lmforge.common.local_store import LocalStore
from lmforge.common.storage import expand_inputs_with_sizes, input_size, open_store
from lmforge.common.store import Store
from lmforge.dataprep import components, layout
from lmforge.dataprep.combine import combine_tasks
from lmforge.dataprep.config import DataprepConfig
from lmforge.dataprep.dedup_global import check_minhash_config, resolved_minhash_config, write_minhash_config
from lmforge.dataprep.progress import Progress
from lmforge.dataprep.run import Run
from lmforge.dataprep.shard_writer import partitions, write_manifest
from lmforge.dataprep.stages import GLOBAL_STAGES
from lmforge.dataprep.steps.reader import BAD_INPUT_PREFIX
from lmforge.dataprep.tasks import Task, input_tasks, partition_tasks, shard_tasks, tokenize_tasks, trace_index_tasks
from lmforge.dataprep.timings import timed_phase
from lmforge.dataprep.tokenize import prepare_tokenizer
from lmforge.dataprep.trace_index import index_partitions, write_index_json

T = TypeVar("T", bound=Task)


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
        sized = expand_inputs_with_sizes(input_patterns)
        inputs = [uri for uri, _ in sized]
        _write_or_check(store, layout.INPUTS, inputs, "input list")
        _write_or_check(store, layout.CONFIG, dump_config(config), "config")
        # the counts "auto" leaves open are chosen once, from the inputs' sizes; every task sees them
        config = config.model_copy(update={"minhash": write_minhash_config(store, config.minhash,
                                                                           [size for _, size in sized])})
    else:
        if not store.exists(layout.INPUTS):
            raise InputError(f"{store.join(layout.INPUTS)} not found: run the per-input stage (with --input) first")
        inputs = json.loads(store.read_text(layout.INPUTS))
        if config is not None:
            _write_or_check(store, layout.CONFIG, dump_config(config), "config")
        config = DataprepConfig.model_validate(json.loads(store.read_text(layout.CONFIG)))
        if store.exists(layout.MINHASH_CONFIG):
            config = config.model_copy(update={"minhash": resolved_minhash_config(store, config.minhash)})
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


def _require_inputs_done(run: Run, inputs: Iterable[int] | None = None) -> None:
    """Every input at `inputs` (all when None) through the per-input stage: a pod checks only the
    inputs its own tasks read, so its requests never grow with the run's inputs."""
    missing = [i for i in (range(run.n_inputs) if inputs is None else inputs)
               if not run.store.exists(layout.input_done(i))]
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


def run_combine(run: Run, indices: Iterable[int] | None = None) -> None:
    tasks = combine_tasks(run.config, run.n_inputs)
    _require_inputs_done(run, None if indices is None else _inputs_of(_chosen(tasks, indices)))
    _require_documents(run)
    check_minhash_config(run.store, run.config.minhash)
    _run_tasks(run, "combine", tasks, indices, unit="tasks")


def _inputs_of(tasks) -> list[int]:
    """The inputs a slice of combine or shards tasks reads (each covers first_input..stop_input)."""
    return sorted({i for task in tasks for i in range(task.first_input, task.stop_input)})


def run_dedup(run: Run, indices: Iterable[int] | None = None) -> None:
    check_minhash_config(run.store, run.config.minhash)
    _run_tasks(run, "dedup", partition_tasks(run.config, run.n_inputs), indices, unit="partitions")


def run_components(run: Run, indices: Iterable[int] | None = None, round: int | None = None) -> dict | None:
    """Round `round` of the components (the tasks at `indices`, all when None); without a round,
    every round not yet settled, then the summary, which it returns."""
    if round is not None:
        _run_tasks(run, "components", components.components_tasks(run.config, run.n_inputs, round), indices,
                   unit="tasks", round=round)
        return None
    if run.store.exists(layout.DEDUP_STATS):
        return json.loads(run.store.read_text(layout.DEDUP_STATS))
    for r in range(components.scheduled_rounds(run.config)):
        if r > 0 and components.settled_by(run.store, run.config, r - 1):
            break  # the later rounds would only mark themselves done
        run_components(run, indices, r)
    return _dedup_summary(run)


def _dedup_summary(run: Run) -> dict:
    if run.store.exists(layout.DEDUP_STATS):
        return json.loads(run.store.read_text(layout.DEDUP_STATS))
    with timed_phase(run.store, "components", 1):
        summary = components.finish_components(run.store, run.config, run.n_inputs)
    run.log.info("dedup_clusters", **summary)
    return summary


def run_tokenizer(run: Run) -> dict:
    _dedup_summary(run)
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
    tasks = shard_tasks(run.config, _tokenizer_info(run), run.n_inputs)
    needed = range(run.n_inputs) if indices is None else _inputs_of(_chosen(tasks, indices))  # a pod: its own
    missing = [i for i in needed if not run.store.exists(layout.tokenize_done(i))]
    if missing:
        raise InputError(f"{len(missing)} input(s) not tokenized yet: run the tokenize stage first")
    _run_tasks(run, "shards", tasks, indices, unit="partitions")
    return run_manifest(run) if indices is None else None


def run_manifest(run: Run) -> dict:
    if run.store.exists(layout.MANIFEST):
        return json.loads(run.store.read_text(layout.MANIFEST))
    with timed_phase(run.store, "report", 1):
        manifest = write_manifest(run.store, run.config, run.n_inputs, _tokenizer_info(run))
    run.log.info("shards_written", **manifest["totals"])
    return manifest


def run_trace_index(run: Run, indices: Iterable[int] | None = None) -> None:
    """The trace index partitions at `indices` (all when None); nothing when disabled."""
    if not run.config.trace_index.enabled:
        run.log.info("phase_start", phase="trace-index", tasks=0, pending=0, disabled=True)
        return
    tasks = trace_index_tasks(run.config, _tokenizer_info(run), run.n_inputs)
    missing = [p for task in _chosen(tasks, indices) for p in task.shard_partitions
               if not run.store.exists(layout.shard_entries(p))]
    if missing:
        raise InputError(f"{len(missing)} shard partition(s) not written yet (e.g. {missing[:5]}): "
                         "run the shards stage first")
    _run_tasks(run, "trace-index", tasks, indices, unit="partitions")


def run_trace_index_json(run: Run) -> dict | None:
    """trace-index/index.json from every partition's entry (None when the index is disabled)."""
    if not run.config.trace_index.enabled:
        return None
    manifest_sha256 = hashlib.sha256(run.store.read_bytes(layout.MANIFEST)).hexdigest()
    with timed_phase(run.store, "report", 1):
        info = write_index_json(run.store, len(index_partitions(run.config, run.n_inputs)), _tokenizer_info(run),
                                manifest_sha256)
    run.log.info("trace_index_written", index=run.store.join(layout.TRACE_INDEX_JSON), tokens=info["tokens"],
                 documents=info["documents"], bytes=info["bytes"], partitions=len(info["partitions"]))
    return info


def run_report(run: Run) -> str:
    from lmforge.dataprep.report import write_report

    run_manifest(run)
    run_trace_index_json(run)
    write_report(run)
    path = run.store.join(layout.REPORT_HTML)
    run.log.info("report_written", report=path, json=run.store.join(layout.REPORT_JSON))
    return path


# One function per stage of stages.STAGES: (run, task indices or None for all, round or None).
STAGE_RUNS: dict[str, Callable[..., object]] = {
    "inputs": lambda run, indices, _round: run_inputs(run, indices),
    "combine": lambda run, indices, _round: run_combine(run, indices),
    "dedup": lambda run, indices, _round: run_dedup(run, indices),
    "components": run_components,
    "tokenizer": lambda run, _indices, _round: run_tokenizer(run),
    "tokenize": lambda run, indices, _round: run_tokenize(run, indices),
    "shards": lambda run, indices, _round: run_shards(run, indices),
    "trace-index": lambda run, indices, _round: run_trace_index(run, indices),
    "report": lambda run, _indices, _round: run_report(run),
}


def stage_task_count(run: Run, stage: str, round: int | None = None) -> int:
    """How many tasks a split stage has (a pod with index k of n runs worker_slice of them)."""
    if stage in ("inputs", "tokenize"):
        return run.n_inputs
    if stage == "combine":
        return len(combine_tasks(run.config, run.n_inputs))
    if stage == "dedup":
        return len(partition_tasks(run.config, run.n_inputs))
    if stage == "components":
        return len(components.components_tasks(run.config, run.n_inputs, round or 0))
    if stage == "shards":
        return len(partitions(run.n_inputs, run.config.shards.inputs_per_partition))
    if stage == "trace-index":  # one per index partition; none when disabled
        return len(index_partitions(run.config, run.n_inputs))
    raise ConfigError(f"{stage!r} is not a split data-prep stage")


def run_stage(run: Run, stage: str, worker_index: int | None = None, num_workers: int = 1,
              round: int | None = None):
    """One stage: all its tasks, or worker `worker_index`'s slice of them (of round `round` for a
    rounds stage: a pod runs one round)."""
    indices = None
    if worker_index is not None:
        if round is None and stage == "components":
            raise ConfigError("a components task slice needs --round (one Indexed Job per round)")
        indices = worker_slice(stage_task_count(run, stage, round), worker_index, num_workers)
    return STAGE_RUNS[stage](run, indices, round)


def run_global_stages(run: Run) -> str:
    """Every stage after the workers, in order, each skipping work already complete; returns the
    report's path."""
    report = None
    for stage in GLOBAL_STAGES:
        report = run_stage(run, stage.name)
    return report


def run_all(run: Run) -> str:
    """Every stage in order, each skipping work already complete; returns the report's path."""
    run_inputs(run)
    return run_global_stages(run)


def default_processes() -> int:
    return max(1, min(os.cpu_count() or 1, 8))
