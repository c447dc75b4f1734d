"""report.json (numbers) and report.html (the same, for people) from the per-stage stats and
the phase timings.

Sizes say what they measure: `file_bytes` are the input files as stored (gzip-compressed for
.gz inputs), `text_bytes` are uncompressed UTF-8 text. Times say what they measure: a phase's
`wall_seconds` is wall-clock (see timings.py), a stage's `worker_seconds` is time spent in the
stage summed over worker processes. Paths inside the output directory are shown relative to
it (the directory may move, as the demo's does), URLs with their credentials redacted.

Memory stays flat however many inputs the run had: the per-input stats are merged one input at a
time (stats.merge_stats: running sums, fixed histograms, bottom-k examples), the tasks are
summarised as they are read (report_tasks: counts, percentiles, the slowest, largest and failed
few), and manifest.json is read without its split indexes.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np

from lmforge.common.config import dump_config
from lmforge.common.local_store import LocalStore
from lmforge.common.shard_index import parse_manifest, split_totals
from lmforge.common.store import Store, local_path_of, scheme_of
from lmforge.dataprep import layout
from lmforge.dataprep.dedup_global import KIND_NEAR, PartitionPlan
from lmforge.dataprep.report_tasks import TaskSummary
from lmforge.dataprep.run import Run
from lmforge.dataprep.shard_writer import partition_count
from lmforge.dataprep.stats import StepStats, merge_stats
from lmforge.dataprep.steps.reader import BAD_INPUT_PREFIX
from lmforge.dataprep.timings import PHASES, phase_summary, read_timings
from lmforge.dataprep.tokenize import read_token_index
from lmforge.dataprep.trace_index import index_partitions, trace_index_section
from lmforge.trace.format import read_index_json

LENGTH_EDGES = [0, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
BAD_INPUT_KINDS = ("truncated_gzip", "truncated_record", "bad_content_length", "corrupt_record", "corrupt_gzip",
                   "non_utf8", "empty_file", "unreadable")
GLOBAL_STAGE_PHASE = {"global_dedup": "dedup", "tokenize": "tokenize", "shards": "shards"}
CONTAMINATION_REPORTS = "reports/contamination-"  # + <eval set>.html, by `lmforge-dataprep contamination-report`
REDACTED = "***"
_SECRET_FIELD = re.compile(r"pass(word|wd)?|secret|credential|api_?key|access_?key|private_?key|auth", re.I)
_SECRET_PARAM = re.compile(_SECRET_FIELD.pattern + r"|token|signature|^sig$|key", re.I)
_URL_IN_TEXT = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>]+", re.I)


def _package_version() -> str:
    try:
        return version("lmforge-dataprep")
    except PackageNotFoundError:
        return "unknown"


def _rate(amount: float, seconds: float, scale: float = 1.0) -> float:
    return round(amount / scale / seconds, 3) if seconds > 0 else 0.0


# ------------------------------------------------------------------ what paths and config show


def redact_uri(value: str) -> str:
    """A URL without the credentials in it (user:password@, signed or token query parameters)."""
    parts = urlsplit(value)
    if not parts.scheme or not parts.netloc:
        return value
    netloc = parts.netloc
    if "@" in netloc:
        netloc = REDACTED + "@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, REDACTED if _SECRET_PARAM.search(k) else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_text(text: str | None) -> str | None:
    """A message with every URL in it redacted."""
    return _URL_IN_TEXT.sub(lambda m: redact_uri(m.group(0)), text) if text else text


def display_path(uri: str, store: Store) -> str:
    """A path as the report shows it: relative to the output directory when inside it, else redacted."""
    if isinstance(store, LocalStore) and scheme_of(uri) == "file":
        path, root = os.path.abspath(local_path_of(uri)), os.path.abspath(store.root)
        if path == root or path.startswith(root + os.sep):
            return os.path.relpath(path, root)
    return redact_uri(uri)


def output_location(store: Store) -> str:
    """'.' (the directory holding the report) for a local output, else its URI: a local
    directory may be moved after the run, an object-store prefix is where the data stays."""
    return "." if isinstance(store, LocalStore) else redact_uri(store.uri)


def shown_config(config_dump: Any, store: Store, field: str = "") -> Any:
    """The resolved config with secrets redacted and paths shown as display_path shows them."""
    if isinstance(config_dump, dict):
        return {k: shown_config(v, store, k) for k, v in config_dump.items()}
    if isinstance(config_dump, list):
        return [shown_config(v, store, field) for v in config_dump]
    if isinstance(config_dump, str):
        if _SECRET_FIELD.search(field) and config_dump:
            return REDACTED
        return display_path(config_dump, store) if ("/" in config_dump or "://" in config_dump) else config_dump
    return config_dump


# ------------------------------------------------------------------ sections


def _stage_entry(stats: StepStats, phase: str) -> dict:
    # tokenize's own bytes_out are token bytes; its text out is the text it tokenized.
    # shards move tokens, not text: no text sizes.
    text_in = None if stats.name == "shards" else stats.bytes_in
    text_out = None if stats.name == "shards" else stats.bytes_in if stats.name == "tokenize" else stats.bytes_out
    return {
        "name": stats.name,
        "phase": phase,
        "docs_in": stats.docs_in,
        "docs_out": stats.docs_out,
        "text_bytes_in": text_in,
        "text_bytes_out": text_out,
        "worker_seconds": round(stats.seconds, 6),
        "dropped": dict(sorted(stats.dropped.items())),
        "counters": dict(sorted(stats.counters.items())),
        "drop_rate": round(stats.docs_dropped / stats.docs_in, 6) if stats.docs_in else 0.0,
        "docs_per_worker_second": _rate(stats.docs_in, stats.seconds),
        "text_mb_per_worker_second": None if text_in is None else _rate(text_in, stats.seconds, 1e6),
    }


def _phases(timings: dict[str, dict], by_name: dict[str, StepStats], file_bytes: int, tokenizer: dict,
            shards: dict, trace_index: dict) -> list[dict]:
    """Each phase's wall-clock and what it got through in that time."""
    empty = StepStats("none")
    work = {
        "inputs": (by_name["read"].docs_in, by_name["read"].bytes_in),
        "dedup": (by_name.get("global_dedup", empty).docs_in, by_name.get("global_dedup", empty).bytes_in),
        "tokenizer": (0, int(tokenizer.get("sample_bytes", 0))),
        "tokenize": (by_name.get("tokenize", empty).docs_in, by_name.get("tokenize", empty).bytes_in),
        "shards": (int(shards["documents"]), 0),
        "trace-index": (int(trace_index.get("documents", 0)), 0),
    }
    tokens = {"tokenize": int(by_name.get("tokenize", empty).counters.get("tokens", 0)),
              "shards": int(shards["tokens"])}
    if trace_index["enabled"]:
        tokens["trace-index"] = int(trace_index["tokens"])
    phases = []
    for name, label in PHASES.items():
        if name == "trace-index" and not trace_index["enabled"]:
            continue  # an optional stage that was off: no phase, rather than one that took 0 s
        timing = timings[name]
        wall = timing["wall_seconds"]
        docs, text_bytes = work.get(name, (0, 0))  # combine, components, report: no documents of their own
        entry = {"name": name, "label": label, **timing,
                 "docs": docs, "docs_per_second": _rate(docs, wall),
                 "text_bytes": text_bytes, "text_mb_per_second": _rate(text_bytes, wall, 1e6)}
        if name == "inputs":
            entry.update(file_bytes=file_bytes, file_mb_per_second=_rate(file_bytes, wall, 1e6))
        if name in tokens:
            entry.update(tokens=tokens[name], tokens_per_second=_rate(tokens[name], wall))
        phases.append(entry)
    return phases


def _pii(stats: StepStats | None, enabled: bool) -> dict:
    counters = dict(stats.counters) if stats else {}
    documents = int(counters.pop("docs_with_pii", 0))
    kept = {k: v for k, v in counters.items() if "kept" in k}
    return {"enabled": enabled, "documents_touched": documents,
            "items_scrubbed": {k: v for k, v in sorted(counters.items()) if k not in kept},
            **({"items_kept": dict(sorted(kept.items()))} if kept else {})}


def _contamination(stats: StepStats | None, eval_sets: list[str], store: Store) -> dict:
    counters = stats.counters if stats else Counter()
    return {
        "enabled": bool(eval_sets),
        "eval_sets": [display_path(p, store) for p in eval_sets],
        "documents_checked": stats.docs_in if stats else 0,
        "documents_removed": stats.docs_dropped if stats else 0,
        # a document matching several sets counts under each
        "documents_per_eval_set": {k.removeprefix("eval:"): v for k, v in sorted(counters.items())
                                   if k.startswith("eval:")},
        "short_eval_texts_skipped": int(counters.get("short_eval_texts_skipped", 0)),
    }


def contamination_reports(store: Store) -> list[str]:
    """The contamination reports in the output (reports/contamination-<eval set>.html), relative paths, sorted."""
    folder = CONTAMINATION_REPORTS.rsplit("/", 1)[0]  # a local store lists folders, not name prefixes
    return [rel for rel in store.list(folder) if rel.startswith(CONTAMINATION_REPORTS) and rel.endswith(".html")]


def _trace_index(run: Run) -> dict:
    """report.json's trace_index section, from trace-index/index.json (written by the report stage before this)."""
    if not run.config.trace_index.enabled:
        return trace_index_section(run.store, None)
    store = run.store
    info = read_index_json(store.read_text(layout.TRACE_INDEX_JSON), store.join(layout.TRACE_INDEX_JSON))
    return trace_index_section(store, info)


def _near_duplicate_groups(store: Store, run: Run) -> int:
    """Connected groups of documents linked by MinHash near-duplicate edges alone."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    plan = PartitionPlan.from_config(run.config.minhash)
    edges = [np.load(io.BytesIO(store.read_bytes(layout.edges(p)))) for p in range(plan.count)
             if store.exists(layout.edges(p))]
    near = np.concatenate(edges) if edges else np.zeros((0, 3), np.uint64)
    near = near[near[:, 2] == KIND_NEAR] if len(near) else near
    if not len(near):
        return 0
    nodes, inverse = np.unique(near[:, :2], return_inverse=True)
    inverse = inverse.reshape(-1, 2)
    graph = coo_matrix((np.ones(len(inverse), np.int8), (inverse[:, 0], inverse[:, 1])), shape=(len(nodes),) * 2)
    return int(connected_components(graph, directed=False)[0])


def _dedup(run: Run, by_name: dict[str, StepStats], dedup: dict) -> dict:
    within = Counter()
    for name in ("url_dedup", "exact_dedup"):
        if name in by_name:
            within.update(by_name[name].dropped)
    return {
        "within_input": dict(sorted(within.items())),
        "removed": dict(sorted(dedup["removed"].items())),  # across inputs, global stage
        "clusters": dedup["clusters"],  # groups linked by URL, content or near-duplicate edges
        "near_duplicate_groups": dedup["near_duplicate_groups"] if "near_duplicate_groups" in dedup
        else _near_duplicate_groups(run.store, run),  # a run clustered before issue 19
        "near_duplicate_enabled": run.config.minhash.enabled,
    }


def _input_row(summary: dict, store: Store) -> dict:
    """An input's filter task, from its stats summary."""
    problems = {k.removeprefix(BAD_INPUT_PREFIX): v for k, v in summary["read_counters"].items()
                if k.startswith(BAD_INPUT_PREFIX) and v}
    return {"phase": "inputs", "task": "filter", "input": display_path(summary["input"], store),
            "seconds": summary["seconds"], "peak_rss_bytes": summary["peak_rss_bytes"],
            "docs_kept": summary.get("docs_kept"), "error": redact_text(summary.get("error")),
            "problems": dict(sorted(problems.items()))}


def _tokenize_row(summary: dict, run: Run) -> dict:
    return {"phase": "tokenize", "task": "tokenize",
            "input": display_path(run.inputs[summary["input_index"]], run.store),
            "seconds": summary["seconds"], "peak_rss_bytes": summary.get("peak_rss_bytes", 0),
            "docs_kept": None, "error": None, "problems": {}}


def _add_shard_and_process_rows(run: Run, tasks: TaskSummary, records: list[dict]) -> None:
    """Each shard partition's task, each index partition's trace-index task, then each main process's part of
    each phase."""
    for partition in range(partition_count(run.n_inputs, run.config.shards.inputs_per_partition)):
        summary = json.loads(run.store.read_text(layout.shard_entries(partition)))
        first, stop = summary["inputs"]
        inputs = display_path(run.inputs[first], run.store)
        if stop - first > 1:
            inputs += f" … ({stop - first} inputs)"
        tasks.add({"phase": "shards", "task": f"shards {partition}", "input": inputs,
                   "seconds": summary["seconds"], "peak_rss_bytes": summary["peak_rss_bytes"],
                   "docs_kept": None, "error": None, "problems": {}}, kind="shards")
    for partition, shard_partitions in enumerate(index_partitions(run.config, run.n_inputs)):
        built = json.loads(run.store.read_text(layout.trace_index_stats(partition)))
        first, last = shard_partitions.start, shard_partitions.stop - 1
        tasks.add({"phase": "trace-index", "task": f"trace-index {partition}",
                   "input": f"shard partition {first}" if first == last else f"shard partitions {first}–{last}",
                   "seconds": built["seconds"], "peak_rss_bytes": built["peak_rss_bytes"],
                   "docs_kept": None, "error": None, "problems": {}}, kind="trace-index")
    for record in records:
        tasks.add({"phase": record["phase"], "task": "main process", "input": None,
                   "host": record["host"], "pid": record["pid"],
                   "seconds": round(record["ended"] - record["started"], 4),
                   "cpu_seconds": record["cpu_seconds"], "peak_rss_bytes": record["peak_rss_bytes"],
                   "docs_kept": None, "error": None, "problems": {}})


def _length_counts(token_counts: np.ndarray) -> np.ndarray:
    edges = np.asarray(LENGTH_EDGES)
    return np.bincount(np.searchsorted(edges, token_counts, side="right") - 1, minlength=len(edges))[: len(edges)]


def _corpus_length_histogram(store: Store, n_inputs: int) -> dict:
    """The document-length histogram of every input, one input's index in memory at a time."""
    counts = np.zeros(len(LENGTH_EDGES), dtype=np.int64)
    for i in range(n_inputs):
        counts += _length_counts(read_token_index(store, i).column("token_count").to_numpy().astype(np.int64))
    return {"edges": LENGTH_EDGES, "counts": counts.astype(int).tolist()}


def _step_lists(store: Store, paths: Iterable[str], on_summary: Callable[[dict], None]) -> Iterator[list[dict]]:
    """Each task summary's step stats, for merge_stats to fold in one at a time; `on_summary` gets
    the rest of each summary (and the reader's counters) as it is read, so that a run of many
    inputs never holds every input's summary, examples and histograms at once."""
    for path in paths:
        summary = json.loads(store.read_text(path))
        steps = summary.pop("steps", [])
        summary["read_counters"] = next((s.get("counters", {}) for s in steps if s["name"] == "read"), {})
        on_summary(summary)
        yield steps


def _step_entry(stats: StepStats, step_type: str, phase: str) -> dict:
    entry = stats.to_dict()
    return {"id": entry.pop("name"), "type": step_type, "phase": phase, "docs_dropped": stats.docs_dropped, **entry,
            "examples": {side: [{k: example.get(k) for k in ("doc_id", "url", "reason", "preview")}
                                for example in stats.examples.get(side, [])] for side in ("removed", "kept")}}


def _steps(run: Run, per_input: list[StepStats], by_name: dict[str, StepStats]) -> list[dict]:
    """Every step that decides which documents go on, in pipeline order, whatever its id or type:
    the reader, the config's pipeline steps that ran, and the global dedup across inputs."""
    order = ["read", *run.config.pipeline]
    shown = sorted((s for s in per_input if s.name in order), key=lambda s: order.index(s.name))
    entries = [_step_entry(s, "reader" if s.name == "read" else _step_type(run, s.name), "inputs") for s in shown]
    if "global_dedup" in by_name:
        entries.append(_step_entry(by_name["global_dedup"], "global_dedup", GLOBAL_STAGE_PHASE["global_dedup"]))
    return entries


def _step_type(run: Run, step_id: str) -> str:
    settings = run.config.step_settings(step_id)
    return settings.type if settings is not None and settings.type else step_id


def build_report(run: Run) -> dict:
    store = run.store
    tasks = TaskSummary()
    gzip_file_bytes = 0

    def input_read(summary: dict) -> None:
        nonlocal gzip_file_bytes
        if urlsplit(summary["input"]).path.endswith(".gz"):  # of the input file bytes, gzip-compressed
            gzip_file_bytes += summary["input_bytes"]
        tasks.add(_input_row(summary, store))

    per_input = merge_stats(_step_lists(store, map(layout.input_stats, range(run.n_inputs)), input_read))
    global_steps = merge_stats(_step_lists(store, map(layout.tokenize_stats, range(run.n_inputs)),
                                           lambda summary: tasks.add(_tokenize_row(summary, run))))
    dedup = json.loads(store.read_text(layout.DEDUP_STATS))
    tokenizer = json.loads(store.read_text(layout.TOKENIZER_STATS))
    shards = json.loads(store.read_text(layout.SHARD_STATS))
    manifest = parse_manifest(store.read_bytes(layout.MANIFEST), store.join(layout.MANIFEST))
    splits = split_totals(manifest)
    records = read_timings(store)
    timings = phase_summary(records)
    _add_shard_and_process_rows(run, tasks, records)

    by_name = {s.name: s for s in [*per_input, *global_steps]}
    if "global_dedup" in by_name:
        # the global dedup's work is the dedup phase (partitions, clustering): its CPU time
        by_name["global_dedup"].seconds += timings["dedup"]["cpu_seconds"] or dedup.get("seconds", 0.0)
    shard_stage = StepStats("shards", docs_in=shards["documents"], docs_out=shards["documents"],
                            seconds=shards["seconds"])
    shard_stage.counters["tokens"] = shards["tokens"]
    shard_stage.counters["shards"] = shards["shards"]
    stages = [*per_input, *global_steps, shard_stage]

    read = by_name["read"]
    bad_input = {k.removeprefix(BAD_INPUT_PREFIX): v for k, v in read.counters.items()
                 if k.startswith(BAD_INPUT_PREFIX)}
    for kind in BAD_INPUT_KINDS:
        bad_input.setdefault(kind, 0)
    languages = Counter({k.removeprefix("lang:"): v for k, v in by_name["langid"].counters.items()}
                        if "langid" in by_name else {})
    totals = manifest["totals"]
    file_bytes = int(read.counters.get("input_bytes", 0))
    kept = by_name.get("tokenize", StepStats("tokenize"))
    trace_index = _trace_index(run)
    phases = _phases(timings, by_name, file_bytes, tokenizer, shards, trace_index)
    recorded = any(p["processes"] for p in phases)
    return {
        "title": "lmforge data-prep report",
        "output": output_location(store),
        "generated_by": f"lmforge-dataprep {_package_version()}",
        "inputs": {
            "files": run.n_inputs,
            "file_bytes": file_bytes,
            "gzip_file_bytes": gzip_file_bytes,
            "text_bytes": read.bytes_in,
            "records": read.docs_in,
            "bad_input": bad_input,
            # the reader's own accounting (input files, records read and rejected, ...)
            "reader": {k: v for k, v in sorted(read.counters.items()) if not k.startswith(BAD_INPUT_PREFIX)},
        },
        "phases": phases,
        "stages": [_stage_entry(s, GLOBAL_STAGE_PHASE.get(s.name, "inputs")) for s in stages],
        "steps": _steps(run, per_input, by_name),
        "languages": dict(languages.most_common()),
        "doc_length_tokens": _corpus_length_histogram(store, run.n_inputs),
        "pii": _pii(by_name.get("pii"), "pii" in dict(run.config.enabled_steps())),
        "contamination": _contamination(by_name.get("contamination"), run.config.steps.contamination.eval_sets, store),
        "dedup": _dedup(run, by_name, dedup),
        "trace_index": trace_index,
        "contamination_reports": contamination_reports(store),
        "tokenizer": {k: tokenizer.get(k) for k in ("sha256", "vocab_size", "eot_id", "trained", "sample_bytes")},
        "totals": {
            "input_file_bytes": file_bytes,
            "input_text_bytes": read.bytes_in,
            "kept_docs": totals["documents"],
            "kept_text_bytes": kept.bytes_in,
            "output_tokens": totals["tokens"],
            "train_tokens": totals["train_tokens"],
            "val_tokens": totals["val_tokens"],
            "train_shards": splits.get("train", {}).get("shards", 0),
            "val_shards": splits.get("val", {}).get("shards", 0),
            "tokens_per_kept_text_byte": round(totals["tokens"] / kept.bytes_in, 6) if kept.bytes_in else 0.0,
            # wall-clock of the phases, each counted once however many processes ran it
            "wall_seconds": round(sum(p["wall_seconds"] for p in phases), 3) if recorded else None,
            "vocab_size": tokenizer["vocab_size"],
        },
        # the tasks worth a row: every one of a phase's few, else its failed, slowest and largest
        "workers": tasks.rows(),
        "task_groups": tasks.summaries(),
        "config": shown_config(dump_config(run.config), store),
    }


def write_report(run: Run) -> dict:
    from lmforge.dataprep.report_html import render_report_html

    report = build_report(run)
    run.store.write_text(layout.REPORT_JSON, json.dumps(report, indent=1))
    run.store.write_text(layout.REPORT_HTML, render_report_html(report))
    return report
