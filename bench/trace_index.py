#!/usr/bin/env python3
"""`make bench-trace`: the trace index (lmforge.trace) at 1x, 4x and 16x a >= 100 M-token corpus: build
throughput, bytes on disk and peak memory per task; then the query latency of tracing 256-token outputs
against 100 M and 1 B tokens, and a model of both at 15 T tokens on the chart's layout.

Corpus: real English text (bench/debian_docs.py: man pages, the PostgreSQL and Python references, the
Debian Reference), 5 % of its documents held out, the rest tokenized with a byte-level BPE trained on it
(32 k ids, u16). One partition of --partition-tokens tokens (data prep's trace-index task: one shard
partition) is filled with the documents in a shuffled order, copy after copy; each copy of a document has
--perturb of its tokens replaced by random ids, so copies share long spans (as near-duplicates on the web
do) without collapsing into one. Scale N has 4*N partitions (--partitions-per-x), built as data prep builds
them: one task per partition, --workers tasks at a time, each in a fresh process with one indexing thread
(lmforge.trace.build.build_partition, the stage's own code). Per task: wall seconds, tokens/s on its one
core, peak RSS of the task process and of its indexer children (getrusage), bytes per token per file.

Query: lmforge.trace.query.trace_tokens (the server's code path below HTTP) over one engine across the
partitions of 100 M tokens (scale 1) and of 1 B tokens (the first 40 partitions of scale 16); each in two
layouts of the same documents: one index partition per shard partition, and shard partitions grouped
(trace_index.shard_partitions_per_index: 4 → one 100 M-token index partition; --large-group 10 → four
250 M-token ones). Before each, dirty pages are written back and the index's files read once (warm).
Outputs: --queries 256-token windows, half copied from training documents (a 64-token window replaced by
held-out text, so several spans), half held-out text (only short common phrases match). min_span_tokens 8,
max_documents 10, span_density 0.05 (the route's defaults). p50/p99 latency, spans per query.

Results: bench/out/trace-index.json and Markdown tables (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import random
import resource
import shutil
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

VOCAB = 32_000


def corpus(workdir: Path) -> tuple[Path, Path]:
    """The tokenizer and the tokenized corpus (train.npz: tokens + document ends; heldout.npz)."""
    tokenizer_path, train_path = workdir / "tokenizer.json", workdir / "train.npz"
    if train_path.exists():
        return tokenizer_path, train_path
    from debian_docs import ENGLISH_PACKAGES, fetch_packages, package_corpus
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    debs = fetch_packages(ENGLISH_PACKAGES, workdir / "debian" / "debs")
    texts = [doc.text for package in ENGLISH_PACKAGES
             for doc in package_corpus(package, "en", debs[package], workdir / "debian")[0]]
    random.Random(0).shuffle(texts)
    held = max(1, len(texts) // 20)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(str(tokenizer_path))
    for name, part in (("heldout", texts[:held]), ("train", texts[held:])):
        encoded = [np.asarray(e.ids, dtype=np.uint16) for e in tokenizer.encode_batch(part)]
        np.savez(workdir / f"{name}.npz", tokens=np.concatenate(encoded),
                 ends=np.cumsum([len(e) for e in encoded]))
    return tokenizer_path, train_path


def documents(path: Path) -> list[np.ndarray]:
    data = np.load(path)
    return np.split(data["tokens"], data["ends"][:-1])


def partition_docs(train: list[np.ndarray], seed: int, tokens: int, perturb: float):
    """One partition's documents: shuffled perturbed copies of the corpus until `tokens` tokens."""
    rng = np.random.default_rng(seed)
    made, copy = 0, 0
    while made < tokens:
        for i in rng.permutation(len(train)):
            doc = train[i].copy()
            hits = rng.random(len(doc)) < perturb
            doc[hits] = rng.integers(1, VOCAB, int(hits.sum()), dtype=np.uint16)
            doc = doc[: tokens - made]
            yield doc, {"doc_id": f"s{seed}-c{copy}-d{i}", "url": f"https://docs.example/{seed}/{copy}/{i}",
                        "record_id": f"<urn:uuid:{seed:08x}-{copy:04x}-{i:08x}>", "shard": f"train_{seed:06d}_0000",
                        "token_offset": made}
            made += len(doc)
            if made >= tokens:
                return
        copy += 1


def build_task(args: tuple) -> dict:
    """One data-prep trace-index task, in a fresh process: its partition's documents, then the build."""
    from lmforge.dataprep.stats import PeakRss
    from lmforge.trace.build import build_partition

    train_path, root, seeds, tokens, perturb, part_tokens = args
    train = documents(train_path)
    # generated before the clock starts; several seeds: shard partitions grouped into one index partition
    docs = [doc for seed in seeds for doc in partition_docs(train, seed, tokens, perturb)]
    name = f"partition-{seeds[0]:06d}"
    peak = PeakRss()  # resets the high-water mark to the RSS now: the documents generated, nothing built
    base = peak.bytes()
    started = time.perf_counter()
    entry = build_partition(iter(docs), Path(root) / name, name, vocab_size=VOCAB, eos_token_id=0,
                            part_tokens=part_tokens, threads=1)
    seconds = time.perf_counter() - started
    (Path(root) / name / "entry.json").write_text(json.dumps(entry))
    return {"entry": entry, "seconds": seconds, "rss_task": peak.bytes() - base,
            # ru_maxrss is in KiB on Linux; a spawned process has run no child before the build
            "rss_indexer": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}


def write_root(root: Path, entries: list[dict], tokenizer: Path, partition_dirs: list[Path] | None = None) -> None:
    from lmforge.trace.format import INDEX_JSON, TOKENIZER, index_json

    root.mkdir(parents=True, exist_ok=True)
    for source in partition_dirs or []:
        link = root / source.name
        if not link.exists():
            link.symlink_to(source)
    shutil.copy(tokenizer, root / TOKENIZER)
    import hashlib
    digest = hashlib.sha256(tokenizer.read_bytes()).hexdigest()
    (root / INDEX_JSON).write_text(json.dumps(index_json(entries, vocab_size=VOCAB, eos_token_id=0,
                                                         tokenizer_sha256=digest)))


def build_scale(scale: int, args, train_path: Path, tokenizer: Path, group: int = 1, shard_partitions: int = 0,
                name: str = "") -> dict:
    """Scale `scale`: partitions_per_x * scale shard partitions (or `shard_partitions`), `group` of them per
    index partition (trace_index.shard_partitions_per_index)."""
    root = Path(args.workdir) / (name or f"index-{scale}x")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    seeds = [1000 * scale + p for p in range(shard_partitions or args.partitions_per_x * scale)]
    groups = [seeds[i:i + group] for i in range(0, len(seeds), group)]
    n = len(groups)
    jobs = [(train_path, root, g, args.partition_tokens, args.perturb, args.part_tokens) for g in groups]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn"),
                             max_tasks_per_child=1) as pool:
        tasks = list(pool.map(build_task, jobs))
    wall = time.perf_counter() - started
    entries = [t["entry"] for t in tasks]
    write_root(root, entries, tokenizer)
    tokens = sum(e["tokens"] for e in entries)
    files: dict[str, int] = {}
    for e in entries:
        for name, f in e["files"].items():
            files[name] = files.get(name, 0) + f["bytes"]
    rates = [t["entry"]["tokens"] / t["seconds"] for t in tasks]
    return {"scale": scale, "partitions": n, "shard_partitions_per_index": group, "tokens": tokens,
            "wall_seconds": wall, "workers": args.workers,
            "tokens_per_second_per_core": {"median": statistics.median(rates), "min": min(rates), "max": max(rates)},
            "task_seconds_median": statistics.median(t["seconds"] for t in tasks),
            "bytes_per_token": sum(files.values()) / tokens,
            "bytes_per_token_by_file": {name: b / tokens for name, b in sorted(files.items())},
            "peak_rss_task_max": max(t["rss_task"] for t in tasks),  # above the generated documents' RSS
            "peak_rss_indexer_max": max(t["rss_indexer"] for t in tasks),
            "root": str(root)}


def queries(args, train_path: Path, heldout_path: Path) -> list[np.ndarray]:
    """Half training windows with a held-out middle, half held-out text; 256 tokens each."""
    rng = np.random.default_rng(7)
    train = [d for d in documents(train_path) if len(d) >= 256]
    held = [d for d in documents(heldout_path) if len(d) >= 256]
    out = []
    for q in range(args.queries):
        src = held[rng.integers(len(held))]
        s = int(rng.integers(0, len(src) - 255))
        window = src[s:s + 256].copy()
        if q % 2 == 0:
            doc = train[rng.integers(len(train))]
            t = int(rng.integers(0, len(doc) - 255))
            middle = window[:64].copy()
            window = doc[t:t + 256].copy()
            window[96:160] = middle
        out.append(window.astype(np.int64))
    return out


def warm(root: Path) -> None:
    """Write back what the builds left dirty, then read the index's files once: latency is measured on a warm
    page cache with no writeback running (a replica serving after its download), not on the builder's I/O."""
    os.sync()
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as fh:
                while fh.read(16 << 20):
                    pass


def query_latency(root: Path, tokenizer: Path, ids: list[np.ndarray]) -> dict:
    from tokenizers import Tokenizer

    from lmforge.trace.engine import TraceIndex
    from lmforge.trace.query import trace_tokens

    warm(root)
    started = time.perf_counter()
    index = TraceIndex.open(root)
    opened = time.perf_counter() - started
    decode = Tokenizer.from_file(str(tokenizer)).decode
    trace_tokens(index, ids[0].tolist(), decode=decode)  # first touch of the engine's code paths
    seconds, spans, docs = [], [], []
    for q in ids:
        started = time.perf_counter()
        result = trace_tokens(index, q.tolist(), min_span_tokens=8, max_documents=10, span_density=0.05,
                              decode=decode)
        seconds.append(time.perf_counter() - started)
        spans.append(len(result.spans))
        docs.append(sum(len(s.documents) for s in result.spans))
    seconds.sort()
    return {"tokens": index.tokens, "partitions": index.partitions, "open_seconds": opened, "queries": len(ids),
            "p50_ms": 1000 * seconds[len(seconds) // 2],
            "p99_ms": 1000 * seconds[min(len(seconds) - 1, math.ceil(0.99 * len(seconds)) - 1)],
            "mean_ms": 1000 * statistics.mean(seconds), "spans_per_query": statistics.mean(spans),
            "documents_per_query": statistics.mean(docs)}


def model_15t(builds: list[dict], latency: list[dict], args) -> dict:
    """Index size and query latency at 15 T tokens on the chart's layout: index partitions of
    shard_partitions_per_index shard partitions of --chart-partition-tokens tokens each.

    A query's cost is a sum over index partitions; the cost of one partition, c(T), is fitted as a + b·log2(T)
    (the suffix-array searches' depth) through the two grouped measurements: one 100 M-token partition and
    the 1 B-token index in 250 M-token partitions (p50 / partitions). c is in this machine's milliseconds
    with the engine on both cores; a pod with C cores does it 2/C as long. The 15 T index cannot sit on one
    replica's disk, so the model spreads the partitions over R trace replicas queried in parallel and asks
    how many make the p50 one second."""
    bytes_per_token = builds[-1]["bytes_per_token"]
    points = [(lat["partition_tokens"], lat["p50_ms"] / lat["partitions"]) for lat in latency if lat["grouped"]]
    (t1, c1), (t2, c2) = sorted(points)
    slope = (c2 - c1) / (math.log2(t2) - math.log2(t1))

    def cost_ms(partition_tokens: float) -> float:
        return c1 + slope * (math.log2(partition_tokens) - math.log2(t1))

    tokens = 15e12
    rows = []
    for group in (1, args.chart_group):
        partition_tokens = group * args.chart_partition_tokens
        partitions = math.ceil(tokens / partition_tokens)
        work_ms = partitions * cost_ms(partition_tokens) * 2 / args.model_cores
        replicas = math.ceil(work_ms / 1000)
        rows.append({"shard_partitions_per_index": group, "index_partition_tokens": partition_tokens,
                     "index_partitions": partitions, "partition_ms": cost_ms(partition_tokens),
                     "one_replica_p50_seconds": work_ms / 1000, "replicas_for_1s": replicas,
                     "disk_per_replica_bytes": tokens * bytes_per_token / replicas})
    return {"tokens": tokens, "bytes": tokens * bytes_per_token, "bytes_per_token": bytes_per_token,
            "cost_fit": {"partition_tokens": [t1, t2], "partition_ms": [c1, c2]},
            "model_cores": args.model_cores, "layouts": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="/tmp/lmforge-trace-bench")
    parser.add_argument("--scales", default="1,4,16")
    parser.add_argument("--partitions-per-x", type=int, default=4)
    parser.add_argument("--partition-tokens", type=int, default=25_000_000)
    parser.add_argument("--part-tokens", type=int, default=25_000_000, help="trace_index.part_tokens")
    parser.add_argument("--perturb", type=float, default=0.01)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--large-tokens", type=float, default=1e9, help="the second query index (tokens)")
    parser.add_argument("--chart-partition-tokens", type=float, default=2e8,
                        help="tokens of one shard partition at full scale (docs/scaling.md: 16 WET inputs)")
    parser.add_argument("--large-group", type=int, default=10,
                        help="shard partitions per index partition of the grouped 1 B-token index")
    parser.add_argument("--chart-group", type=int, default=10,
                        help="shard_partitions_per_index of the 15 T model's grouped layout")
    parser.add_argument("--model-cores", type=int, default=16, help="cores per trace replica in the model")
    parser.add_argument("--keep", action="store_true", help="keep the indexes")
    parser.add_argument("--out", default=str(REPO / "bench" / "out"))
    args = parser.parse_args()

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    tokenizer, train_path = corpus(workdir)
    corpus_tokens = int(np.load(train_path)["ends"][-1])
    print(f"corpus: {corpus_tokens:,} training tokens of real text, vocab {VOCAB}", flush=True)
    builds = []
    for scale in map(int, args.scales.split(",")):
        result = build_scale(scale, args, train_path, tokenizer)
        builds.append(result)
        print(json.dumps({k: v for k, v in result.items() if k != "root"}), flush=True)
    # the same documents as index partitions of several shard partitions (trace_index.shard_partitions_per_index)
    large_shards = max(1, round(args.large_tokens / args.partition_tokens))
    grouped = [build_scale(1, args, train_path, tokenizer, group=args.partitions_per_x, name="index-1x-grouped"),
               build_scale(16, args, train_path, tokenizer, group=args.large_group, shard_partitions=large_shards,
                           name="index-large-grouped")]
    for result in grouped:
        print(json.dumps({k: v for k, v in result.items() if k != "root"}), flush=True)
    ids = queries(args, train_path, workdir / "heldout.npz")
    biggest = Path(builds[-1]["root"])
    entries = [json.loads((biggest / f"partition-{1000 * int(args.scales.split(',')[-1]) + p:06d}" / "entry.json")
                          .read_text()) for p in range(builds[-1]["partitions"])]
    keep = entries[:large_shards]
    large_root = workdir / "index-large"
    shutil.rmtree(large_root, ignore_errors=True)
    write_root(large_root, keep, tokenizer, [biggest / e["name"] for e in keep])
    latency = []
    for root, group in ((Path(builds[0]["root"]), 1), (Path(grouped[0]["root"]), args.partitions_per_x),
                        (large_root, 1), (Path(grouped[1]["root"]), args.large_group)):
        result = query_latency(root, tokenizer, ids)
        result.update(shard_partitions_per_index=group, grouped=group > 1,
                      partition_tokens=result["tokens"] / result["partitions"])
        latency.append(result)
        print(json.dumps(result), flush=True)
    model = model_15t(builds, latency, args)
    result = {"machine": f"{platform.machine()} {os.cpu_count()} CPUs", "corpus_tokens": corpus_tokens,
              "perturb": args.perturb, "partition_tokens": args.partition_tokens, "part_tokens": args.part_tokens,
              "builds": builds, "grouped_builds": grouped, "latency": latency, "model_15t": model,
              "load_average": os.getloadavg()[0]}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "trace-index.json").write_text(json.dumps(result, indent=1))
    print("| scale | partitions | tokens | tokens/s/core (median) | bytes/token | peak RSS task | peak RSS indexer |"
          " wall s |\n|---|---|---|---|---|---|---|---|")
    for b in builds + grouped:
        print(f"| {b['scale']}x{' grouped' if b['shard_partitions_per_index'] > 1 else ''} | {b['partitions']} | "
              f"{b['tokens'] / 1e6:,.0f} M | "
              f"{b['tokens_per_second_per_core']['median'] / 1e6:.2f} M | {b['bytes_per_token']:.2f} | "
              f"{b['peak_rss_task_max'] / 2**20:.0f} MiB | {b['peak_rss_indexer_max'] / 2**20:.0f} MiB | "
              f"{b['wall_seconds']:.0f} |")
    print("| index | shard partitions per index | index partitions | p50 ms | p99 ms | spans/query |\n"
          "|---|---|---|---|---|---|")
    for lat in latency:
        print(f"| {lat['tokens'] / 1e6:,.0f} M tokens | {lat['shard_partitions_per_index']} | {lat['partitions']} | "
              f"{lat['p50_ms']:.1f} | {lat['p99_ms']:.1f} | {lat['spans_per_query']:.1f} |")
    print("| 15 T layout | index partition tokens | index partitions | ms per partition | one replica p50 s |"
          f" replicas for a 1 s p50 ({args.model_cores} cores each) | index per replica |\n"
          "|---|---|---|---|---|---|---|")
    for row in model["layouts"]:
        print(f"| {row['shard_partitions_per_index']} shard partitions per index | "
              f"{row['index_partition_tokens'] / 1e9:g} B | {row['index_partitions']:,} | {row['partition_ms']:.0f} | "
              f"{row['one_replica_p50_seconds']:,.0f} | {row['replicas_for_1s']:,} | "
              f"{row['disk_per_replica_bytes'] / 1e12:.2f} TB |")
    print(json.dumps(model, indent=1))
    if not args.keep:
        for b in builds + grouped:
            shutil.rmtree(b["root"], ignore_errors=True)
        shutil.rmtree(large_root, ignore_errors=True)


if __name__ == "__main__":
    main()
