#!/usr/bin/env python3
"""docs/scaling.md's tables: data prep for a whole crawl, from what bench/dataprep_scaling.py measured.

Reads bench/out/dataprep-scaling.json (`make bench-dataprep-scaling`): per-phase CPU seconds per
WET MB at one worker on one core, the bench output's files and bytes by kind, the duplicate edges
and documents, and the per-task peak RSS and CPU of the flatness runs. Without it, the figures of
docs/benchmarks.md's 2026-11-21 run (PROVISIONAL below), marked as such in the tables. Scales them
to --wet-tb of WET, --docs documents and --input-files WET files on --pods one-core pods, picks the
minhash.partitions_per_band and minhash.cluster_tasks that keep those tasks under the per-task
budget (or says that none does), and writes the tables between the markers in docs/scaling.md
(--write) or prints them.

The code's layout as of issue 19's redesign and "Dedup reads at crawl scale" (layout.py,
dedup_keys.py, dedup_global.py): one key file per input with a section per dedup partition of
(doc id, key, signature row) triples; (bands + 2) x partitions_per_band dedup tasks, each reading
its section of every input's key file (a HEAD, its two offsets and its section per input) and the
signature row of every candidate (one GET each, plus two .npy-header GETs per input with a
candidate), READ_THREADS (16) reads at a time; cluster_tasks forests and one merge; removed ids
per input.
Bytes-per-item constants of the tasks whose memory grows with the corpus come from reading their
code (MEMORY comments below) or from measuring the objects they hold (stated where so).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- scale-model:begin -->", "<!-- scale-model:end -->"
INPUTS_TAG = "<!-- scale-model-inputs "
MIB = 2**20
PART = 8 * MIB  # lmforge.common.s3 DEFAULT_PART_SIZE: whole-object GETs and multipart PUTs
RANGE = MIB  # Store.open_read (S3Bucket.open_ranged): Parquet/Arrow reads are ranged GETs of ≥ 1 MiB
BLOCK = 4 * MIB  # the manifest's block_bytes: one block_sha256 each, and the trainer's fetch unit
MAX_TASK_RSS = 1.5e9  # issue 19's per-task budget
S3_PREFIX_PUTS, S3_PREFIX_GETS = 3_500, 5_500  # requests/s per prefix before S3 scales a prefix out
# ASSUMED: the time to first byte of one S3 request (the trainer streaming bench puts its proxy 20 ms
# away); what dominates a task that makes many small GETs. A task's requests are paid one after
# another, except a dedup task's reads, READ_THREADS at a time (dedup_global.READ_THREADS).
REQUEST_LATENCY = 0.020
READ_THREADS = 16

# docs/benchmarks.md, "Data prep: lmforge vs Hugging Face datatrove (2026-11-21)": 205.5 MB of WET,
# 50,000 records, one core, 145.1 s end to end (1.42 MB/s). Per-input stages read..minhash: 98.74 s;
# tokenize 36.78 s; shards 0.69 s; global dedup 0.04 s plus the rest of the 145.1 s (~8.85 s), all
# counted as dedup. The tokenizer: ASSUMED 60 s for a 64 MB sample. File sizes and edges: a 10 MB dev
# run of bench/dataprep_scaling.py (2026-11-25, before the redesign: its key files were one per column;
# their bytes scaled here by 24 x 20 / (16 x 20 + 8), the (doc id, key, row) sections of today).
PROVISIONAL = {
    "input": {"files": 16, "wet_bytes": 205.5e6, "records": 50_000, "gz_bytes": 91.5e6},
    "phases": {"inputs": 98.74, "dedup": 0.04 + 8.85, "tokenize": 36.78, "shards": 0.69, "tokenizer": 60.0},
    "dedup": {"records": 50_000, "docs_into_global_dedup": 34_000, "edges": 3547 / 1824 * 34_000,
              "removed": {"near_duplicate": 3_000}, "clusters": 3_000},
    "totals": {"kept_docs": 31_000, "output_tokens": 22_683_842},
    "output_files": {"wet_input": (4471955, 16), "docs": (2444663, 16), "dedup_keys": (914107, 16),
                     "signatures": (935936, 16), "edges": (87688, 20), "removed": (3358, 16),
                     "tokens": (2212404, 16), "token_index": (251984, 16), "filter_rejects": (190120, 16),
                     "dedup_rejects": (98013, 16), "shards": (2226516, 4), "lineage": (102897, 2),
                     "tokenizer": (124070, 1), "manifest": (4259, 1), "report": (80991, 2), "small": (50052, 76)},
    "output_wet_bytes": 10.1e6,
    "task_rss": {"inputs": 229 * MIB, "dedup": 166 * MIB, "cluster": 159 * MIB, "tokenizer": 272 * MIB,
                 "tokenize": 257 * MIB, "shards": 260 * MIB, "report": 165 * MIB},
    "flat_slopes": {},  # CPU seconds per WET MB (cluster) and per input (report) of the flatness runs
    "config": {"partitions_per_band": 1, "cluster_tasks": 1, "num_perm": 128, "shard_tokens": 50_000_000,
               "inputs_per_partition": 1, "sample_bytes": 64 << 20},
    "tokenizer_sample_bytes": 64 << 20, "partitions": 20,
}

CLUSTER_SECONDS_PER_EDGE = 200e-9  # ASSUMED when the run has no flatness cluster task to take a slope from
# ASSUMED when the run has no flatness dedup tasks to take it from: the client CPU of one S3 request
# (botocore's signing and parsing), paid under the GIL whatever the threads.
REQUEST_CPU_SECONDS = 2e-3

# MEMORY, bytes per item held at a task's peak (read off the code):
# dedup (group_partition): its section of every input, (doc id, key, signature row) 24 B, their
# concatenation 24 B, the lexsort order 8 B and the sorted copies 24 B, all alive until the task
# ends, per entry of the partition (N / partitions_per_band).
DEDUP_BYTES_PER_ENTRY = 80
# dedup, per input: ThreadPoolExecutor.map submits every read at once, so each input's read is a
# Future (with its Condition, RLock and deque) and a _WorkItem until it is collected, ~1.5 kB; and its
# section's objects (the bytes, the array and its reshaped and column views, the tuple), ~0.7 kB.
# ESTIMATED from CPython 3.11's object sizes, not measured.
FUTURE_BYTES = 1_500
SECTION_OBJECT_BYTES = 700
# dedup, near partitions (_read_signatures): every candidate's signature row (num_perm x 4 B) held at
# once, its bytes and ndarray objects, the dict entry, the index arrays and lists (~300 B), and a
# Future per row read while the reads run (FUTURE_BYTES). ESTIMATED like the above.
ROW_OBJECT_BYTES = 300
# cluster (cluster_group): the edge array (24 B), np.unique over both ends (sorted copy, inverse, argsort
# ~48 B), the sparse graph (~15 B), the near-only copy and its forest on top: ~100 B per edge.
CLUSTER_BYTES_PER_EDGE = 100
# merge (merge_clusters): every forest's rows (nodes, roots, kinds, near rows: 33 B) in the parts and
# again joined, the pair stacks (32 B) and _forest over them (~60 B): ~160 B per forest row. A document
# with a duplicate is a row of every cluster task whose partitions hold one of its edges.
MERGE_BYTES_PER_ROW = 160
FOREST_BYTES_PER_ROW = 33
# report: two stats JSONs per input parsed (~12 kB, measured with tracemalloc) and its task rows (~1.2 kB);
# the manifest parsed: ~700 B per shard entry and ~140 B per block hash (measured), as every trainer rank.
REPORT_BYTES_PER_INPUT = 13_200
MANIFEST_ENTRY_BYTES, MANIFEST_BLOCK_BYTES = 700, 140
MANIFEST_ENTRY_JSON, MANIFEST_BLOCK_JSON, MANIFEST_INPUT_JSON = 270, 70, 110  # its JSON text, measured

PHASES = ("inputs", "dedup", "cluster", "merge", "tokenizer", "tokenize", "shards", "report")


def load(path: Path) -> tuple[dict, bool]:
    if not path.exists():
        return PROVISIONAL, True
    raw = json.loads(path.read_text())
    bench = raw["scaling"]
    flat = raw.get("flatness") or {}
    flat_phases = flat.get("phases", {})
    phases = {name: p["workers_1"].get("cpu_seconds", 0.0) for name, p in bench["phases"].items()}
    dedup = bench["dedup"]
    task_rss = {name: max(row["peak_rss_bytes"]["values"]) for name, row in flat_phases.items()}
    for name, p in bench["phases"].items():
        task_rss.setdefault(name, p["workers_1"].get("peak_rss_bytes", 0))
    slopes = {}
    factors = flat.get("factors") or []
    if len(factors) >= 2:
        span = factors[-1] - factors[0]
        for name, per in (("cluster", flat.get("base_wet_mb")), ("report", flat.get("files_at_1x"))):
            cpu = (flat_phases.get(name) or {}).get("cpu_seconds")
            if cpu and per and cpu[-1] > cpu[0]:  # else lost in the process start: not measured
                slopes[name] = (cpu[-1] - cpu[0]) / (span * per)
    flat_dedup = None
    if len(factors) >= 2 and (flat_phases.get("dedup") or {}).get("cpu_seconds"):
        flat_dedup = {"factors": factors, "base_wet_mb": flat.get("base_wet_mb"),
                      "files_at_1x": flat.get("files_at_1x"), "cpu_seconds": flat_phases["dedup"]["cpu_seconds"]}
    config = bench.get("config") or {}
    minhash, shards, tokenizer = (config.get(k) or {} for k in ("minhash", "shards", "tokenizer"))
    return {
        "input": bench["input"], "phases": phases,
        "dedup": {"records": dedup["records"], "docs_into_global_dedup": dedup["docs_into_global_dedup"],
                  "edges": dedup["edges"], "removed": dedup["removed_across_inputs"],
                  "clusters": dedup["clusters"]},
        "totals": {k: bench["totals"][k] for k in ("kept_docs", "output_tokens", "kept_text_bytes")
                   if k in bench["totals"]},
        "vocab_size": (bench.get("tokenizer") or {}).get("vocab_size"),
        "output_files": {k: (v["bytes"], v["files"]) for k, v in bench["output_files"].items()},
        "output_wet_bytes": bench["input"]["wet_bytes"], "task_rss": task_rss, "flat_slopes": slopes,
        "flat_dedup": flat_dedup,
        "config": {"partitions_per_band": minhash.get("partitions_per_band", 1),
                   "cluster_tasks": minhash.get("cluster_tasks", 1), "num_perm": minhash.get("num_perm", 128),
                   "shard_tokens": shards.get("shard_tokens", 50_000_000),
                   "inputs_per_partition": shards.get("inputs_per_partition", 1),
                   "sample_bytes": tokenizer.get("sample_bytes", 64 << 20)},
        "tokenizer_sample_bytes": (bench.get("tokenizer") or {}).get("sample_bytes") or 64 << 20,
        "partitions": bench["output_files"]["edges"]["files"], "date": raw.get("date"),
    }, False


def human(n: float, unit: str = "") -> str:
    for scale, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {suffix}{unit}".strip()
    return f"{n:.0f} {unit}".strip()


def _grid(top: int) -> list[int]:
    """1, 2, … top, geometrically (~5% apart): the settings the model tries."""
    out, x = [], 1.0
    while x <= top:
        if not out or int(x) != out[-1]:
            out.append(int(x))
        x *= 1.05
    return out


class Crawl:
    """The measured run scaled to one crawl size: documents, duplicates, files."""

    def __init__(self, m: dict, wet_tb: float, docs: float, input_files: float):
        self.m, self.wet_tb, self.inputs = m, wet_tb, max(int(round(input_files)), 1)
        self.wet_mb = wet_tb * 1e6
        self.bench_mb = m["input"]["wet_bytes"] / 1e6
        per_doc = docs / m["input"]["records"]
        d = m["dedup"]
        self.n = d["docs_into_global_dedup"] * per_doc  # documents in the key files
        self.edges = d["edges"] * per_doc
        removed = sum(d["removed"].values())
        self.removed = removed * per_doc
        self.dup_docs = (removed + d["clusters"]) * per_doc  # documents with a duplicate: the forests' nodes
        # LSH band edges: all but the exact ones (about one URL or content edge per document removed as
        # such; an exact copy also collides in every band, so it counts among the near edges too)
        exact = sum(v for k, v in d["removed"].items() if k != "near_duplicate")
        self.near_edges = max(self.edges - exact * per_doc, 0.0)
        self.kept = m["totals"]["kept_docs"] * per_doc
        self.tokens = m["totals"]["output_tokens"] * self.wet_mb / self.bench_mb
        cfg = m["config"]
        self.bands = m["partitions"] // max(cfg["partitions_per_band"], 1) - 2
        self.row_bytes = 4 * cfg["num_perm"]  # a signature row: num_perm uint32

    def scaled(self, kind: str) -> tuple[float, float]:
        """(bytes, files) of a kind of output file at this crawl size, per-input kinds one per input."""
        nbytes, nfiles = self.m["output_files"][kind]
        total = nbytes * self.wet_mb * 1e6 / self.m["output_wet_bytes"]
        per_input = nfiles / self.m["input"]["files"]
        return total, max(per_input * self.inputs, 1)

    # ---- dedup: one partitions_per_band setting
    def dedup(self, ppb: int) -> dict:
        parts = (self.bands + 2) * ppb
        candidates = 2 * self.near_edges / max(self.bands * ppb, 1)  # signature rows one near task reads
        hit = 1 - math.exp(-candidates / self.inputs)  # share of inputs with a candidate in a near task
        base = self.m["task_rss"].get("dedup", 0)
        memory = {"keys": DEDUP_BYTES_PER_ENTRY * self.n / ppb,
                  "inputs": self.inputs * (FUTURE_BYTES + SECTION_OBJECT_BYTES),
                  "signatures": candidates * (self.row_bytes + ROW_OBJECT_BYTES + FUTURE_BYTES)}
        key_requests = 3 * self.inputs  # per task and input: a HEAD (store.exists), its offsets, its section
        near_gets = key_requests + candidates + 2 * self.inputs * hit
        gets = self.bands * ppb * near_gets + 2 * ppb * key_requests
        key_bytes = 24 * self.n * (self.bands + 2) + 16 * parts * self.inputs
        sig_bytes = self.bands * ppb * (candidates * self.row_bytes + 128 * self.inputs * hit)
        return {"ppb": ppb, "tasks": parts, "rss": base + sum(memory.values()), "memory": memory,
                "near_task_gets": near_gets, "gets": gets, "key_bytes": key_bytes, "sig_bytes": sig_bytes,
                "key_gets": parts * key_requests, "sig_gets": self.bands * ppb * (candidates + 2 * self.inputs * hit),
                "candidates": candidates, "hit": hit}

    def best_dedup(self) -> tuple[dict, bool]:
        """The smallest partitions_per_band whose largest dedup task is under the budget, else the one
        with the least memory (False: none fits)."""
        tried = [self.dedup(p) for p in _grid(100_000)]
        fits = [d for d in tried if d["rss"] <= MAX_TASK_RSS]
        return (fits[0], True) if fits else (min(tried, key=lambda d: d["rss"]), False)

    # ---- cluster: one cluster_tasks setting
    def cluster(self, tasks: int, partitions: int) -> dict:
        tasks = min(tasks, partitions)
        rows = min(tasks * self.dup_docs, 2 * self.edges)  # forest rows: a node once per task it has edges in
        base = self.m["task_rss"].get("cluster", 0)
        return {"tasks": tasks, "task_rss": base + CLUSTER_BYTES_PER_EDGE * self.edges / tasks,
                "merge_rss": base + MERGE_BYTES_PER_ROW * rows, "rows": rows}

    def cluster_tasks_alone(self, partitions: int) -> dict:
        """The fewest cluster tasks that keep each under the budget, ignoring the merge."""
        base = self.m["task_rss"].get("cluster", 0)
        need = math.ceil(CLUSTER_BYTES_PER_EDGE * self.edges / max(MAX_TASK_RSS - base, 1))
        return self.cluster(max(need, 1), max(partitions, need))

    def best_cluster(self, partitions: int) -> tuple[dict, bool]:
        tried = [self.cluster(c, partitions) for c in _grid(partitions) + [partitions]]
        fits = [c for c in tried if max(c["task_rss"], c["merge_rss"]) <= MAX_TASK_RSS]
        best = min(tried, key=lambda c: max(c["task_rss"], c["merge_rss"]))
        return (fits[0], True) if fits else (best, False)


def request_cpu(m: dict) -> tuple[float, bool]:
    """CPU seconds per S3 request of a dedup task, and whether measured: the flatness runs' dedup
    tasks (over S3, at 1x and 4x the input) less the local run's dedup CPU for the extra WET, over
    the extra requests this model counts for them."""
    fd = m.get("flat_dedup")
    if not fd or not fd.get("base_wet_mb") or not fd.get("files_at_1x"):
        return REQUEST_CPU_SECONDS, False
    bench_mb = m["input"]["wet_bytes"] / 1e6

    def requests(f: float) -> float:
        mb = f * fd["base_wet_mb"]
        d = Crawl(m, mb / 1e6, m["input"]["records"] * mb / bench_mb, fd["files_at_1x"] * f).dedup(
            m["config"]["partitions_per_band"])
        return d["gets"] + 2 * d["tasks"]  # and per task: its edges' HEAD and PUT

    (f0, f1), (c0, c1) = (fd["factors"][0], fd["factors"][-1]), (fd["cpu_seconds"][0], fd["cpu_seconds"][-1])
    compute = m["phases"].get("dedup", 0.0) / bench_mb * (f1 - f0) * fd["base_wet_mb"]
    extra = requests(f1) - requests(f0)
    if extra <= 0 or c1 - c0 - compute <= 0:
        return REQUEST_CPU_SECONDS, False
    return (c1 - c0 - compute) / extra, True


def model(m: dict, wet_tb: float, docs: float, pods: int, input_files: float, trainer: dict) -> dict:
    c = Crawl(m, wet_tb, docs, input_files)
    inputs = c.inputs
    dd, dedup_fits = c.best_dedup()
    cl, cluster_fits = c.best_cluster(dd["tasks"])
    cfg = m["config"]
    shard_parts = math.ceil(inputs / cfg["inputs_per_partition"])
    phases = m["phases"]
    slopes = m.get("flat_slopes") or {}
    # cluster and merge CPU: the flatness cluster task's CPU per WET MB (both together), shared by items
    # (edges for the tasks, forest rows for the merge); else an assumed cost per edge
    bench_c = Crawl(m, m["input"]["wet_bytes"] / 1e12, m["input"]["records"], m["input"]["files"])
    cluster_assumed = "cluster" not in slopes
    bench_cluster_cpu = (bench_c.edges * CLUSTER_SECONDS_PER_EDGE if cluster_assumed
                         else slopes["cluster"] * c.bench_mb)
    per_item = bench_cluster_cpu / max(bench_c.edges + bench_c.dup_docs, 1)
    scale = c.wet_mb / c.bench_mb
    cpu = {"inputs": phases.get("inputs", 0.0) * scale,
           # the 1-worker run times cluster and merge as part of "dedup" (runner.run_cluster)
           "dedup": max(phases.get("dedup", 0.0) - bench_cluster_cpu, 0.0) * scale,
           "cluster": per_item * c.edges, "merge": per_item * cl["rows"],
           "tokenizer": phases.get("tokenizer", 0.0) * cfg["sample_bytes"] / max(m["tokenizer_sample_bytes"], 1),
           "tokenize": phases.get("tokenize", 0.0) * scale, "shards": phases.get("shards", 0.0) * scale,
           "report": slopes.get("report", 0.0) * inputs}
    # a dedup task's requests cost client CPU too (the local run reads no S3): measured per request
    per_request, request_cpu_measured = request_cpu(m)
    dedup_request_cpu = per_request * (dd["gets"] + 2 * dd["tasks"])
    cpu["dedup"] += dedup_request_cpu
    tasks = {"inputs": inputs, "dedup": dd["tasks"], "cluster": cl["tasks"], "merge": 1, "tokenizer": 1,
             "tokenize": inputs, "shards": shard_parts, "report": 1}

    files = {k: c.scaled(k) for k in m["output_files"]}
    for kind in ("tokenizer", "report"):  # sized by the vocabulary and the report's fixed sections
        files[kind] = m["output_files"][kind]
    shards_per_part = 1 + math.ceil(c.tokens / shard_parts / cfg["shard_tokens"])  # ≥ one val, train by size
    n_shards = shard_parts * shards_per_part
    shard_bytes = files["shards"][0]
    blocks = shard_bytes / BLOCK + n_shards  # a shard's last block is partial
    manifest_bytes = n_shards * MANIFEST_ENTRY_JSON + blocks * MANIFEST_BLOCK_JSON + inputs * MANIFEST_INPUT_JSON
    manifest_parsed = n_shards * MANIFEST_ENTRY_BYTES + blocks * MANIFEST_BLOCK_BYTES
    files["shards"] = (shard_bytes, 2 * n_shards)
    files["lineage"] = (files["lineage"][0], n_shards)
    files["manifest"] = (manifest_bytes, 1)
    files["edges"] = (24 * c.edges, dd["tasks"])
    files["forest"] = (FOREST_BYTES_PER_ROW * cl["rows"], cl["tasks"])

    def whole(kind: str, times: float = 1.0, unit: int = PART) -> tuple[float, float]:
        total, count = files[kind]
        return total * times, count * times * max(1, math.ceil(total / count / unit))

    def put(kind: str) -> tuple[float, float]:
        total, count = files[kind]
        b, r = whole(kind)
        return b, r + (2 * count if total / count > PART else 0)  # multipart create + complete

    bench_docs = m["output_files"]["docs"][0]  # the docs Parquet per byte of kept text (compressed)
    docs_per_text = bench_docs / max(m["totals"].get("kept_text_bytes") or bench_docs, 1)
    sample_read = cfg["sample_bytes"] * docs_per_text + files["docs"][0] / inputs  # the sample, then one input
    wet_part = max(1, math.ceil(files["wet_input"][0] / inputs / PART))
    # phase -> requests by prefix: (prefix, GET bytes, GETs, PUT bytes, PUTs)
    io = {
        "inputs": [("WET files", files["wet_input"][0], inputs * wet_part, 0, 0),
                   *((prefix, 0, 0, *put(k)) for k, prefix in (
                       ("docs", "work/docs/"), ("dedup_keys", "work/minhash/keys/"), ("signatures", "work/minhash/"),
                       ("filter_rejects", "rejects/"), ("small", "work/stats/, work/done/")))],
        "dedup": [("work/minhash/keys/", dd["key_bytes"], dd["key_gets"], 0, 0),
                  ("work/minhash/ (signatures)", dd["sig_bytes"], dd["sig_gets"], 0, 0),
                  ("work/dedup/", 0, 0, *put("edges"))],
        "cluster": [("work/dedup/", *whole("edges"), *put("forest"))],
        "merge": [("work/dedup/", *whole("forest"), 0, 0), ("work/dedup/removed/", 0, 0, *put("removed"))],
        "tokenizer": [("work/docs/", sample_read, sample_read / RANGE + 2, *put("tokenizer"))],
        "tokenize": [("work/docs/", *whole("docs", unit=RANGE), 0, 0), ("work/dedup/removed/", *whole("removed"), 0, 0),
                     ("tokenizer.json", files["tokenizer"][0] * inputs, inputs, 0, 0),
                     ("work/tokens/", 0, 0, *(a + b for a, b in zip(put("tokens"), put("token_index")))),
                     ("rejects/", 0, 0, *put("dedup_rejects"))],
        "shards": [("work/tokens/", *(a + b for a, b in zip(whole("tokens"), whole("token_index"))), 0, 0),
                   ("shards/", 0, 0, *put("shards")), ("lineage/", 0, 0, *put("lineage")),
                   ("work/shards/", 0, 0, shard_parts * 1e3, shard_parts)],
        "report": [("work/stats/", files["small"][0] / 2, 2 * inputs, 0, 0),
                   ("work/tokens/", *whole("token_index", unit=RANGE), 0, 0),
                   ("work/shards/", 2 * shard_parts * 1e3, 2 * shard_parts, 0, 0),
                   ("outputs", 0, 0, *(a + b for a, b in zip(put("manifest"), put("report"))))],
    }
    rows, s3 = [], []
    for name in PHASES:
        parts = io[name]
        get_b, get_r = sum(x[1] for x in parts), sum(x[2] for x in parts)
        put_b, put_r = sum(x[3] for x in parts), sum(x[4] for x in parts)
        n = tasks[name]
        # a task's requests in sequence, a dedup task's reads READ_THREADS at a time: their waits
        # overlap their client CPU, so a dedup task takes its other CPU plus the longer of the two
        request_seconds = (get_r / (READ_THREADS if name == "dedup" else 1) + put_r) * REQUEST_LATENCY
        if name == "dedup":
            task_seconds = (cpu[name] - dedup_request_cpu + max(dedup_request_cpu, request_seconds)) / n
        else:
            task_seconds = (cpu[name] + request_seconds) / n
        wall = task_seconds * n / min(pods, n)
        rows.append({"phase": name, "tasks": n, "cpu_hours": cpu[name] / 3600,
                     "request_hours": request_seconds / 3600, "wall_hours": wall / 3600,
                     "task_seconds": task_seconds,
                     "request_cpu_hours": (dedup_request_cpu if name == "dedup" else 0.0) / 3600,
                     "per_core_mb_s": c.bench_mb / phases[name] if phases.get(name) and name in
                     ("inputs", "tokenize", "shards") else None,
                     "assumed": name in ("cluster", "merge") and cluster_assumed})
        # the busiest prefix: its GETs and PUTs per second against S3's per-prefix rates
        load_of = [(max(x[2] / S3_PREFIX_GETS, x[4] / S3_PREFIX_PUTS) / max(wall, 1e-9), x[0]) for x in parts]
        busiest, prefix = max(load_of)
        s3.append({"phase": name, "put_bytes": put_b, "put_requests": put_r, "get_bytes": get_b,
                   "get_requests": get_r, "requests_per_second": (get_r + put_r) / max(wall, 1e-9),
                   "short": wall < 60, "prefix_load": busiest, "prefix": prefix})

    rss = m["task_rss"]
    memory = [
        {"phase": "inputs", "at_scale": rss.get("inputs", 0), "grows_with": "flat (one input per task)"},
        {"phase": "dedup", "at_scale": dd["rss"],
         "grows_with": f"{human(c.n)} docs / {dd['ppb']:,} per band x {DEDUP_BYTES_PER_ENTRY} B "
                       f"({human(dd['memory']['keys'], 'B')}); {inputs:,} inputs' reads and sections x "
                       f"{(FUTURE_BYTES + SECTION_OBJECT_BYTES) / 1e3:.1f} kB ({human(dd['memory']['inputs'], 'B')}); "
                       f"{human(dd['candidates'])} candidates' signature rows x "
                       f"{(c.row_bytes + ROW_OBJECT_BYTES + FUTURE_BYTES) / 1e3:.1f} kB "
                       f"({human(dd['memory']['signatures'], 'B')})"},
        {"phase": "cluster", "at_scale": cl["task_rss"],
         "grows_with": f"{human(c.edges)} edges / {cl['tasks']:,} tasks x {CLUSTER_BYTES_PER_EDGE} B"},
        {"phase": "merge", "at_scale": cl["merge_rss"],
         "grows_with": f"{human(cl['rows'])} forest rows ({human(c.dup_docs)} docs with a duplicate, once per "
                       f"cluster task holding one of their edges) x {MERGE_BYTES_PER_ROW} B"},
        {"phase": "tokenizer", "at_scale": rss.get("tokenizer", 0),
         "grows_with": f"flat (the {human(cfg['sample_bytes'], 'B')} sample and one input)"},
        {"phase": "tokenize", "at_scale": rss.get("tokenize", 0), "grows_with": "flat (one input, its removed ids)"},
        {"phase": "shards", "at_scale": rss.get("shards", 0),
         "grows_with": f"flat ({cfg['inputs_per_partition']} input(s) per shard partition)"},
        {"phase": "report", "at_scale": rss.get("report", 0) + REPORT_BYTES_PER_INPUT * inputs + manifest_parsed,
         "grows_with": f"{inputs:,} inputs' stats x {REPORT_BYTES_PER_INPUT / 1e3:.1f} kB + the manifest parsed "
                       f"({human(n_shards)} entries x {MANIFEST_ENTRY_BYTES} B + {human(blocks)} block hashes x "
                       f"{MANIFEST_BLOCK_BYTES} B)"},
    ]
    for row in memory:
        row["measured"] = rss.get(row["phase"], rss.get("cluster", 0))

    # the trainer reading the shards: a 4 MiB block per sequence once the corpus outgrows the cache
    token_bytes = 2 if (m.get("vocab_size") or 65_536) <= 65_536 else 4
    seq_bytes = (trainer["seq_len"] + 1) * token_bytes
    miss = max(0.0, 1 - trainer["cache_bytes"] / max(shard_bytes, 1))
    seqs_per_s = trainer["nodes"] * trainer["tokens_per_node_s"] / trainer["seq_len"]
    train = {"amplification": BLOCK / seq_bytes, "miss": miss, "gets_per_s": seqs_per_s * miss,
             "bytes_per_s": seqs_per_s * miss * BLOCK, "manifest_parsed": manifest_parsed, **trainer}

    serial = sum(r["wall_hours"] for r in rows if r["tasks"] == 1 and r["phase"] != "tokenizer")
    return {"rows": rows, "s3": s3, "memory": memory, "dedup": dd, "dedup_fits": dedup_fits, "cluster": cl,
            "cluster_fits": cluster_fits, "cluster_alone": c.cluster_tasks_alone(dd["tasks"]),
            "request_cpu": per_request, "request_cpu_measured": request_cpu_measured,
            "crawl": c, "measured_date": m.get("date") or "an unrecorded date", "n_shards": n_shards, "blocks": blocks,
            "manifest_bytes": manifest_bytes, "trainer": train, "serial_hours": serial,
            "wall_hours": sum(r["wall_hours"] for r in rows)}


def _crossing(m: dict, args: argparse.Namespace, metric) -> float | None:
    """The crawl size (WET TB, documents and files in proportion) at which metric(result) turns
    positive; None when it is already positive at 1 GB, inf when not by 1 PB."""
    def at(tb: float) -> float:
        ratio = tb / args.wet_tb
        return metric(model(m, tb, args.docs * ratio, args.pods, args.input_files * ratio, _trainer(args)))

    lo, hi = math.log(1e-3), math.log(1e3)
    if at(math.exp(lo)) > 0:
        return None
    if at(math.exp(hi)) <= 0:
        return math.inf
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if at(math.exp(mid)) > 0 else (mid, hi)
    return math.exp(hi)


def _trainer(args: argparse.Namespace) -> dict:
    return {"nodes": args.train_nodes, "seq_len": args.seq_len, "tokens_per_node_s": args.train_tokens_per_node_s,
            "cache_bytes": args.cache_bytes}


def _rss_of(phase: str):
    return lambda r: next(x["at_scale"] for x in r["memory"] if x["phase"] == phase) - MAX_TASK_RSS


def _rate_of(phase: str):
    """Over S3's per-prefix rate for ten minutes or more (shorter bursts are retried through)."""
    def metric(r):
        row = next(x for x in r["rows"] if x["phase"] == phase)
        load = next(x for x in r["s3"] if x["phase"] == phase)["prefix_load"]
        return load - 1 if row["wall_hours"] >= 1 / 6 else -1.0
    return metric


def limits(m: dict, args: argparse.Namespace) -> list[dict]:
    """What gives way, each with the crawl size at which it does, smallest first."""
    out = [
        ("dedup task memory", "the largest dedup task passes 1.5 GB at the best `partitions_per_band`",
         _rss_of("dedup")),
        ("cluster merge memory", "the merge (or a cluster task) passes 1.5 GB at the best `cluster_tasks`",
         lambda r: max(r["cluster"]["task_rss"], r["cluster"]["merge_rss"]) - MAX_TASK_RSS),
        ("report memory", "the report task passes 1.5 GB", _rss_of("report")),
        ("trainer block GETs", f"{args.train_nodes:,} training nodes' block fetches pass {S3_PREFIX_GETS:,} GET/s "
                               "on the shards' prefix", lambda r: r["trainer"]["gets_per_s"] - S3_PREFIX_GETS),
        ("dedup request time", f"a dedup task's S3 requests ({READ_THREADS} at a time, or their client CPU, whichever "
                               "is longer) take longer than its other CPU work",
         lambda r: 2 * max(r["rows"][1]["request_hours"], r["rows"][1]["request_cpu_hours"])
         - r["rows"][1]["cpu_hours"]),
        ("serial tail", "the one-task steps (merge, report) take longer than all the parallel phases",
         lambda r: 2 * r["serial_hours"] - r["wall_hours"]),
    ]
    out += [(f"{p} request rate", f"the {p} phase's busiest prefix passes S3's {S3_PREFIX_GETS:,} GET/s or "
             f"{S3_PREFIX_PUTS:,} PUT/s for ten minutes or more", _rate_of(p)) for p in PHASES]
    rows = [{"name": name, "what": what, "wet_tb": _crossing(m, args, metric)} for name, what, metric in out]
    return sorted(rows, key=lambda r: -1 if r["wet_tb"] is None else r["wet_tb"])


def _size(tb: float | None) -> str:
    if tb is None:
        return "under 1 GB"
    return "not by 1 PB" if math.isinf(tb) else human(tb * 1e12, "B")


def render(result: dict, provisional: bool, args: argparse.Namespace, broken: list[dict]) -> str:
    mark = " (PROVISIONAL: docs/benchmarks.md's 2026-11-21 figures until `make bench-dataprep-scaling` runs)" \
        if provisional else f" (from bench/out/dataprep-scaling.json, run of {result['measured_date']})"
    c, dd, cl = result["crawl"], result["dedup"], result["cluster"]
    total_cpu = sum(r["cpu_hours"] for r in result["rows"])
    out = [f"Generated by `.venv/bin/python bench/scale_model.py --write docs/scaling.md`{mark}: "
           f"{args.wet_tb:g} TB of WET, {human(args.docs)} documents, {args.input_files:,} WET files, "
           f"{args.pods:,} one-core pods; every S3 request {REQUEST_LATENCY * 1e3:.0f} ms (assumed), a task's "
           f"requests one after another, a dedup task's reads {READ_THREADS} at a time.", "",
           f"Settings the model picks: `minhash.partitions_per_band = {dd['ppb']:,}` ({dd['tasks']:,} dedup "
           f"tasks), " + ("the smallest that keeps every dedup task under 1.5 GB" if result["dedup_fits"] else
                          f"the least dedup task memory any setting gives ({human(dd['rss'], 'B')}: none keeps it "
                          f"under 1.5 GB)") +
           f"; `minhash.cluster_tasks = {cl['tasks']:,}`, " +
           ("the smallest that keeps the cluster tasks and the merge under 1.5 GB." if result["cluster_fits"] else
            f"the least memory for the larger of a cluster task and the merge (none keeps both under 1.5 GB: "
            f"{result['cluster_alone']['tasks']:,} cluster tasks keep each under it, and then the merge holds "
            f"{human(result['cluster_alone']['merge_rss'], 'B')})."),
           "", "| phase | tasks | per-core WET MB/s | CPU-hours | request-hours | wall at the pods (h) |",
           "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        rate = f"{r['per_core_mb_s']:.2f}" if r["per_core_mb_s"] else "–"
        flag = " (assumed, see below)" if r["assumed"] else ""
        out.append(f"| {r['phase']} | {r['tasks']:,} | {rate} | {r['cpu_hours']:,.1f}{flag} | "
                   f"{r['request_hours']:,.1f} | {r['wall_hours']:.2f} |")
    out += [f"| **total** | | | **{total_cpu:,.0f}** | **{sum(r['request_hours'] for r in result['rows']):,.0f}** "
            f"| **{result['wall_hours']:.1f}** |", "",
            "| phase | PUT | PUT requests | GET | GET requests | requests/s over the phase | busiest prefix, "
            "share of S3's per-prefix rate |", "|---|---|---|---|---|---|---|"]
    for r in result["s3"]:
        rate = human(r["requests_per_second"]) + (" (phase under a minute)" if r["short"] else "")
        out.append(f"| {r['phase']} | {human(r['put_bytes'], 'B')} | {human(r['put_requests'])} | "
                   f"{human(r['get_bytes'], 'B')} | {human(r['get_requests'])} | {rate} | "
                   f"`{r['prefix']}` {r['prefix_load']:.0%} |")
    out += ["", "| task | peak RSS measured | at this scale | what grows |", "|---|---|---|---|"]
    for r in result["memory"]:
        out.append(f"| {r['phase']} | {human(r['measured'], 'B')} | {human(r['at_scale'], 'B')} | {r['grows_with']} |")
    largest = max(result["memory"], key=lambda r: r["at_scale"])
    out += ["", f"Largest single task: **{largest['phase']}**, {human(largest['at_scale'], 'B')}. A near-duplicate "
            f"dedup task makes {human(dd['near_task_gets'])} ranged GETs and HEADs, {READ_THREADS} at a time "
            f"({human(3 * c.inputs)} for its key-file sections, {human(dd['candidates'])} signature rows; "
            f"{dd['near_task_gets'] * REQUEST_LATENCY / READ_THREADS / 3600:.2f} h at "
            f"{REQUEST_LATENCY * 1e3:.0f} ms each)."]
    t = result["trainer"]
    out += ["", f"Shards: {human(result['n_shards'])} with {human(result['blocks'])} block hashes, one manifest of "
            f"{human(result['manifest_bytes'], 'B')} ({human(t['manifest_parsed'], 'B')} parsed, in the report task "
            f"and in every training rank). Trainer at {t['nodes']:,} nodes of {human(t['tokens_per_node_s'])} "
            f"tokens/s (assumed), seq_len {t['seq_len']:,}, a {human(t['cache_bytes'], 'B')} block cache per node: "
            f"{t['amplification']:.0f}x read amplification, {t['miss']:.1%} of sequences miss the cache, "
            f"{human(t['gets_per_s'])} GET/s and {human(t['bytes_per_s'], 'B')}/s from S3 "
            f"(~{S3_PREFIX_GETS:,} GET/s per prefix)."]
    out += ["", "What gives way first as the crawl grows (documents and files in proportion to the WET; "
            "the crawl size at which each passes its limit):", ""]
    for k, r in enumerate([r for r in broken if r["wet_tb"] is None or not math.isinf(r["wet_tb"])], 1):
        out.append(f"{k}. **{r['name']}** at {_size(r['wet_tb'])} of WET: {r['what']}.")
    never = [r["name"] for r in broken if r["wet_tb"] is not None and math.isinf(r["wet_tb"])]
    if never:
        out += ["", f"Not reached by 1 PB of WET: {', '.join(never)}."]
    out += ["", f"Derived: {human(c.n)} documents into dedup, {human(c.edges)} duplicate edges "
            f"({human(c.near_edges)} near), {human(c.dup_docs)} documents with a duplicate, "
            f"{human(c.removed)} removed, "
            f"{human(c.kept)} kept, {human(c.tokens)} tokens. Assumed where not measured: "
            f"{REQUEST_LATENCY * 1e3:.0f} ms per S3 request; "
            + ("cluster and merge CPU from the flatness runs' cluster task" if not result["rows"][2]["assumed"] else
               f"cluster {CLUSTER_SECONDS_PER_EDGE * 1e9:.0f} ns of CPU per edge")
            + f"; {result['request_cpu'] * 1e3:.1f} ms of client CPU per dedup S3 request ("
            + ("from the flatness runs' dedup tasks over S3" if result["request_cpu_measured"] else "assumed")
            + "); signature rows read per near task = 2 x its near edges; a dedup task's Python objects "
            "(estimated from CPython's object sizes, `MEMORY` in bench/scale_model.py)."]
    return "\n".join(out)


def section(measured: dict, provisional: bool, scale: dict) -> str:
    """The generated part of docs/scaling.md: the tables, then what they were computed from (one
    comment line), so that check() can recompute them."""
    args = argparse.Namespace(**scale)
    result = model(measured, args.wet_tb, args.docs, args.pods, args.input_files, _trainer(args))
    text = render(result, provisional, args, limits(measured, args))
    inputs = json.dumps({"measured": measured, "provisional": provisional, "scale": scale}, sort_keys=True)
    return f"{text}\n{INPUTS_TAG}{inputs} -->"


def generated_part(doc: str) -> str:
    return doc.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def check(doc: str) -> bool:
    """Whether a document's generated part is what its recorded inputs give (no hand edits)."""
    part = generated_part(doc)
    recorded = json.loads(part.rsplit(INPUTS_TAG, 1)[1].removesuffix(" -->"))
    return part == section(recorded["measured"], recorded["provisional"], recorded["scale"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", default=str(REPO / "bench" / "out" / "dataprep-scaling.json"))
    p.add_argument("--wet-tb", type=float, default=10.0)
    p.add_argument("--docs", type=float, default=3e9)
    p.add_argument("--pods", type=int, default=1000)
    p.add_argument("--input-files", type=int, default=90_000, help="WET files of the crawl (one input task each)")
    p.add_argument("--train-nodes", type=int, default=1000, help="training nodes streaming the shards")
    p.add_argument("--train-tokens-per-node-s", type=float, default=400_000,
                   help="tokens a training node consumes per second (assumed)")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--cache-bytes", type=float, default=64 * 2**30, help="the trainer's data.cache_bytes")
    p.add_argument("--write", metavar="MARKDOWN", help="replace the text between the scale-model markers of this file")
    args = p.parse_args()
    measured, provisional = load(Path(args.bench))
    scale = {"wet_tb": args.wet_tb, "docs": args.docs, "pods": args.pods, "input_files": args.input_files,
             "train_nodes": args.train_nodes, "train_tokens_per_node_s": args.train_tokens_per_node_s,
             "seq_len": args.seq_len, "cache_bytes": args.cache_bytes}
    text = section(measured, provisional, scale)
    if not args.write:
        print(text)
        return
    path = Path(args.write)
    doc = path.read_text()
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
