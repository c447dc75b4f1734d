"""Runs the data-prep phases, locally (a process pool) or as one worker of an Indexed Job.

Phases and their completion markers (a rerun skips what is complete):
  inputs    per input: kept docs, rejects, signatures, stats   → work/done/input-*
  dedup     per partition (LSH band / URL / content): edges    → work/dedup/edges-*.npy
  cluster   connected components → removed ids                → work/dedup/removed.npz
  tokenizer train or load                                      → tokenizer.json
  tokenize  per input: tokens + index + dedup rejects          → work/done/tokenize-*
  shards    shuffle, split, shards, lineage                     → manifest.json (last)
  report    report.json + report.html
Every process records its part of each phase it worked on (wall-clock, CPU, peak RSS) under
work/timings/ (timings.py); the report adds them up per phase.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field

from lmforge.common.config import dump_config
from lmforge.common.errors import ConfigError, InputError, StorageError
from lmforge.common.logging import StructLogger, get_logger
from lmforge.common.storage import LocalStore, Store, expand_inputs, input_size, open_store
from lmforge.dataprep import layout
from lmforge.dataprep.config import DataprepConfig
from lmforge.dataprep.dedup_global import (
    PartitionPlan,
    check_minhash_config,
    cluster,
    group_partition,
    load_removed,
    write_minhash_config,
)
from lmforge.dataprep.progress import Progress
from lmforge.dataprep.shard_writer import write_shards
from lmforge.dataprep.steps.reader import BAD_INPUT_PREFIX
from lmforge.dataprep.timings import timed_phase
from lmforge.dataprep.tokenize import prepare_tokenizer, tokenize_input
from lmforge.dataprep.worker import process_input


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


def worker_slice(n_items: int, worker_index: int, num_workers: int) -> list[int]:
    """Items of one worker: every num_workers-th, starting at worker_index."""
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


# ------------------------------------------------------------------ process pool

_STATE: dict = {}
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent(parent_pid: int) -> None:
    """Make this pool worker die when the process that started it does, even by SIGKILL: an
    orphaned worker would go on writing into an output directory that a rerun may already be
    writing to. Linux: the parent-death signal; elsewhere the pool's own EOF check remains."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)


def _init_worker(output: str, config_json: str, parent_pid: int) -> None:
    _die_with_parent(parent_pid)
    _STATE["store"] = open_store(output)
    _STATE["config"] = DataprepConfig.model_validate_json(config_json)


def _pool_task(fn_name: str, *args):
    return _TASKS[fn_name](_STATE["store"], _STATE["config"], *args)


def _task_input(store, config, uri, i):
    return process_input(store, config, uri, i)


def _task_partition(store, config, n_inputs, p):
    return group_partition(store, config.minhash, n_inputs, p)


def _task_tokenize(store, config, info, i):
    removed, reasons = load_removed(store)
    return tokenize_input(store, config, info, i, removed, reasons)


_TASKS: dict[str, Callable] = {"input": _task_input, "partition": _task_partition, "tokenize": _task_tokenize}


def _map(run: Run, fn_name: str, argsets: list[tuple], progress: Progress,
         on_result: Callable | None = None) -> list:
    results = []
    if run.processes == 1 or len(argsets) <= 1:
        for args in argsets:
            result = _TASKS[fn_name](run.store, run.config, *args)
            results.append(result)
            if on_result:
                on_result(result)
            progress.advance()
        return results
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(run.processes, len(argsets)), mp_context=context,
                             initializer=_init_worker,
                             initargs=(run.store.uri, run.config.model_dump_json(), os.getpid())) as pool:
        futures = [pool.submit(_pool_task, fn_name, *args) for args in argsets]
        try:
            for future in as_completed(futures):
                result = future.result()
                results.append(result)
                if on_result:
                    on_result(result)
                progress.advance()
        except BaseException:
            # one task failed (a full disk fails them all): stop, do not start the queued ones
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return results


# ------------------------------------------------------------------ phases


def run_inputs(run: Run, indices: Iterable[int] | None = None) -> list:
    indices = list(range(run.n_inputs) if indices is None else indices)
    pending = [i for i in indices if not run.store.exists(layout.input_done(i))]
    run.log.info("phase_start", phase="inputs", inputs=len(indices), pending=len(pending),
                 input_bytes=sum(input_size(run.inputs[i]) or 0 for i in pending))
    progress = Progress(run.log, "inputs", len(pending))

    def report(result):
        run.log.info("input_done", input=result.uri, seconds=round(result.seconds, 3),
                     docs_kept=result.docs_kept, peak_rss_bytes=result.peak_rss_bytes)

    with timed_phase(run.store, "inputs", len(pending)):
        results = _map(run, "input", [(run.inputs[i], i) for i in pending], progress, report)
    progress.close()
    return results


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
    plan = PartitionPlan.from_config(run.config.minhash)
    indices = list(range(plan.count) if indices is None else indices)
    pending = [p for p in indices if not run.store.exists(layout.edges(p))]
    run.log.info("phase_start", phase="dedup", partitions=len(indices), pending=len(pending))
    progress = Progress(run.log, "dedup", len(pending), unit="partitions")
    with timed_phase(run.store, "dedup", len(pending)):
        _map(run, "partition", [(run.n_inputs, p) for p in pending], progress)
    progress.close()


def run_cluster(run: Run) -> dict:
    if run.store.exists(layout.DEDUP_REMOVED) and run.store.exists(layout.DEDUP_STATS):
        return json.loads(run.store.read_text(layout.DEDUP_STATS))
    started = time.perf_counter()
    with timed_phase(run.store, "dedup", 1):
        summary = cluster(run.store, run.config.minhash)
        summary["seconds"] = round(time.perf_counter() - started, 4)
        run.store.write_text(layout.DEDUP_STATS, json.dumps(summary, indent=1))
    run.log.info("dedup_clusters", **summary)
    return summary


def _kept_bytes(run: Run) -> int:
    total = 0
    for i in range(run.n_inputs):
        steps = json.loads(run.store.read_text(layout.input_stats(i)))["steps"]
        total += steps[-1]["bytes_out"]
    return total


def run_tokenizer(run: Run) -> dict:
    if not run.store.exists(layout.DEDUP_REMOVED):
        raise InputError("dedup clusters not computed yet: run the cluster stage first")
    with timed_phase(run.store, "tokenizer", 0 if run.store.exists(layout.TOKENIZER_STATS) else 1):
        removed, _ = load_removed(run.store)
        info = prepare_tokenizer(run.store, run.config, run.n_inputs, removed, _kept_bytes(run))
    run.log.info("tokenizer_ready", **info)
    return info


def _tokenizer_info(run: Run) -> dict:
    if not run.store.exists(layout.TOKENIZER_STATS):
        raise InputError("tokenizer not prepared yet: run the tokenizer stage first")
    return json.loads(run.store.read_text(layout.TOKENIZER_STATS))


def run_tokenize(run: Run, indices: Iterable[int] | None = None) -> None:
    info = _tokenizer_info(run)
    indices = list(range(run.n_inputs) if indices is None else indices)
    pending = [i for i in indices if not run.store.exists(layout.tokenize_done(i))]
    run.log.info("phase_start", phase="tokenize", inputs=len(indices), pending=len(pending))
    progress = Progress(run.log, "tokenize", len(pending))
    with timed_phase(run.store, "tokenize", len(pending)):
        _map(run, "tokenize", [(info, i) for i in pending], progress)
    progress.close()


def run_shards(run: Run) -> dict:
    if run.store.exists(layout.MANIFEST):
        return json.loads(run.store.read_text(layout.MANIFEST))
    missing = [i for i in range(run.n_inputs) if not run.store.exists(layout.tokenize_done(i))]
    if missing:
        raise InputError(f"{len(missing)} input(s) not tokenized yet: run the tokenize stage first")
    with timed_phase(run.store, "shards", 1):
        manifest = write_shards(run.store, run.config, run.n_inputs, _tokenizer_info(run), run.inputs)
    run.log.info("shards_written", shards=len(manifest["shards"]), **manifest["totals"])
    return manifest


def run_report(run: Run) -> str:
    from lmforge.dataprep.report import write_report

    if not run.store.exists(layout.MANIFEST):
        raise InputError("manifest.json not written yet: run the shards stage first")
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
