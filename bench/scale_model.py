#!/usr/bin/env python3
"""docs/scaling.md's tables: data prep for a whole crawl, from what bench/dataprep_scaling.py measured.

Reads bench/out/dataprep-scaling.json (`make bench-dataprep-scaling`): per-phase CPU seconds per
WET MB at one worker on one core, the bench output's files and bytes by kind, the duplicate edges
per document and the per-task peak RSS. Without it, the figures of docs/benchmarks.md's
2026-11-21 run (PROVISIONAL below), marked as such in the tables. Scales them linearly to
--wet-tb of WET and --docs documents on --pods one-core pods, and writes the tables between the
markers in docs/scaling.md (--write) or prints them.

What is linear and what is not is stated per line of the tables; bytes-per-item constants of
the tasks whose memory grows with the corpus come from reading their code (see MEMORY).
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
PART = 8 * MIB  # lmforge.common.s3 DEFAULT_PART_SIZE: ranged GETs and multipart PUTs
MAX_TASK_RSS = 1.5e9  # issue 19's per-task budget
S3_PREFIX_PUTS, S3_PREFIX_GETS = 3_500, 5_500  # requests/s per prefix before S3 scales a prefix out

# docs/benchmarks.md, "Data prep: lmforge vs Hugging Face datatrove (2026-11-21)": 205.5 MB of WET,
# 50,000 records, one core, 145.1 s end to end (1.42 MB/s). Per-input stages read..minhash: 98.74 s;
# tokenize 36.78 s; shards 0.69 s; global dedup 0.04 s plus the rest of the 145.1 s (~8.85 s: process
# start, writes, the dedup partition scans, the report), all counted as dedup. The tokenizer was
# trained outside that run (3.3 s on a small sample): ASSUMED 60 s for a 64 MB sample.
# File sizes and edges: a 10 MB dev run of bench/dataprep_scaling.py (2026-11-25). Per-task memory: below.
PROVISIONAL = {
    "input": {"files": 16, "wet_bytes": 205.5e6, "records": 50_000, "gz_bytes": 91.5e6},
    "phases": {"inputs": 98.74, "dedup": 0.04 + 8.85, "tokenize": 36.78, "shards": 0.69, "tokenizer": 60.0},
    "dedup": {"records": 50_000, "docs_into_global_dedup": 34_000, "edges_per_dedup_doc": 3547 / 1824,
              "removed": 3_000},
    "totals": {"kept_docs": 31_000, "output_tokens": 22_683_842},
    # bytes per WET byte and files per input, from the 10 MB dev run (16 inputs, 10.1 MB of WET)
    "output_files": {"wet_input": (4471955, 16), "docs": (2444663, 16), "dedup_keys": (624640, 320),
                     "signatures": (935936, 16), "minhash": (314560, 16), "edges": (87688, 20),
                     "removed": (3358, 1), "tokens": (2212404, 16), "token_index": (251984, 16),
                     "filter_rejects": (190120, 16), "dedup_rejects": (98013, 16), "shards": (2226516, 4),
                     "lineage": (102897, 2), "tokenizer": (124070, 1), "manifest": (4259, 1),
                     "report": (80991, 2), "small": (50052, 76)},
    "output_wet_bytes": 10.1e6,
    # per-task peak RSS, the largest of 1x/2x/4x: the flatness part of a bench run at its default sizes
    # (25 MB in 4 files, 2026-11-25, commit 96fa344; memory does not depend on how busy the machine is)
    "task_rss": {"inputs": 229 * MIB, "dedup": 166 * MIB, "cluster": 159 * MIB, "tokenizer": 272 * MIB,
                 "tokenize": 257 * MIB, "shards": 260 * MIB, "report": 165 * MIB},
    "shard_tokens": 50_000_000, "partitions": 20,
}

# Who writes and who reads each kind of file (layout.py; issue 19's task split). A read marked
# "each" is made by every task of the phase (the whole file per task), else once in all.
WRITES = {"inputs": ["docs", "dedup_keys", "signatures", "minhash", "filter_rejects", "small"],
          "dedup": ["edges"], "cluster": ["removed"], "tokenizer": ["tokenizer"],
          "tokenize": ["tokens", "token_index", "dedup_rejects"], "shards": ["shards", "lineage"],
          "report": ["manifest", "report"]}
READS = {"inputs": [("wet_input", "once")], "dedup": [("dedup_keys", "once"), ("signatures", "once")],
         "cluster": [("edges", "once")], "tokenizer": [("docs", "once"), ("removed", "once")],
         "tokenize": [("docs", "once"), ("removed", "each"), ("tokenizer", "each")],
         "shards": [("tokens", "once"), ("token_index", "once")],
         "report": [("token_index", "once"), ("edges", "once")]}
CONSTANT = {"tokenizer", "report"}  # sized by the vocabulary and the report's fixed sections, not the corpus
# Not separately measured by this version of the pipeline (ASSUMED, marked in the tables):
CLUSTER_SECONDS_PER_EDGE = 200e-9  # np.unique + connected_components over the edge list
TOKENIZER_READ_MB_S = 100.0  # the tokenizer task reading and filtering every kept document's Parquet text
PER_INPUT = {"wet_input", "docs", "dedup_keys", "signatures", "minhash", "filter_rejects", "tokens", "token_index",
             "dedup_rejects", "small"}

# Memory that grows with the corpus, bytes per item (from the code at the time of writing):
# dedup URL/content partition (dedup_global.group_partition): ids, keys, input index, lexsort order and
# sorted copies, every document's id kept for signature rows: ~48 B per document into dedup.
# cluster (_components): the edge array (24 B), np.unique over both ends (sorted copy + inverse, 32 B),
# the sparse graph (CSR indices, data, ~13 B) and labels: ~80 B per edge.
# tokenize and tokenizer (load_removed + np.isin): every removed id and reason (9 B) and isin's sort (16 B).
# report: every document's token count (8 B per kept document) and every edge (as cluster, 24 B + unique).



def load(path: Path) -> tuple[dict, bool]:
    if not path.exists():
        return PROVISIONAL, True
    bench = json.loads(path.read_text())["scaling"]
    wet = bench["input"]["wet_bytes"]
    flat = json.loads(path.read_text()).get("flatness", {}).get("phases", {})
    phases = {name: p["workers_1"].get("cpu_seconds", 0.0) for name, p in bench["phases"].items()}
    dedup = bench["dedup"]
    removed = sum(dedup["removed_across_inputs"].values())
    task_rss = {name: max(row["peak_rss_bytes"]["values"]) for name, row in flat.items()}
    for name, p in bench["phases"].items():
        task_rss.setdefault(name, p["workers_1"].get("peak_rss_bytes", 0))
    config = bench.get("config") or {}
    return {
        "input": bench["input"], "phases": phases,
        "dedup": {"records": dedup["records"], "docs_into_global_dedup": dedup["docs_into_global_dedup"],
                  "edges_per_dedup_doc": dedup["edges"] / max(dedup["docs_into_global_dedup"], 1),
                  "removed": removed},
        "totals": bench["totals"],
        "output_files": {k: (v["bytes"], v["files"]) for k, v in bench["output_files"].items()},
        "output_wet_bytes": wet, "task_rss": task_rss,
        "shard_tokens": (config.get("shards") or {}).get("shard_tokens", 50_000_000),
        "partitions": bench["output_files"]["edges"]["files"],
    }, False


def human(n: float, unit: str = "") -> str:
    for scale, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {suffix}{unit}".strip()
    return f"{n:.0f} {unit}".strip()


def model(m: dict, wet_tb: float, docs: float, pods: int, input_files: int) -> dict:
    wet_mb = wet_tb * 1e6
    bench_mb = m["input"]["wet_bytes"] / 1e6
    per_doc = docs / m["input"]["records"]  # documents at scale per bench document
    dedup_docs = m["dedup"]["docs_into_global_dedup"] * per_doc
    edges = m["dedup"]["edges_per_dedup_doc"] * dedup_docs
    removed = m["dedup"]["removed"] * per_doc
    kept = m["totals"]["kept_docs"] * per_doc
    tokens = m["totals"]["output_tokens"] * wet_mb / bench_mb
    tasks = {"inputs": input_files, "dedup": m["partitions"], "cluster": 1, "tokenizer": 1, "tokenize": input_files,
             "shards": input_files, "report": 1}

    rows = []
    phases = dict(m["phases"])
    docs_bytes = m["output_files"]["docs"][0] * wet_mb * 1e6 / m["output_wet_bytes"]
    for name in ("inputs", "dedup", "cluster", "tokenizer", "tokenize", "shards", "report"):
        cpu_bench = phases.get(name, 0.0)
        assumed = False
        if name == "cluster" and "cluster" not in phases:  # inside "dedup" in this version of the pipeline
            cpu, assumed = edges * CLUSTER_SECONDS_PER_EDGE, True
        elif name == "cluster":
            cpu = cpu_bench * edges / max(m["dedup"]["edges_per_dedup_doc"] * m["dedup"]["docs_into_global_dedup"], 1)
        elif name == "tokenizer":  # trains on a bounded sample (constant) after reading every kept document
            cpu, assumed = cpu_bench + docs_bytes / 1e6 / TOKENIZER_READ_MB_S, True
        else:
            cpu = cpu_bench * wet_mb / bench_mb
        n_tasks = tasks[name]
        wall = cpu / min(pods, n_tasks)
        rows.append({"phase": name, "tasks": n_tasks, "cpu_hours": cpu / 3600, "wall_hours": wall / 3600,
                     "per_core_mb_s": bench_mb / cpu_bench if cpu_bench and name != "cluster" else None,
                     "assumed": assumed})

    # S3: bytes and requests per phase
    files = {}
    bench_shards = max(m["output_files"]["shards"][1] // 2, 1)
    for kind, (nbytes, nfiles) in m["output_files"].items():
        total = nbytes if kind in CONSTANT else nbytes * wet_mb * 1e6 / m["output_wet_bytes"]
        if kind == "manifest":  # one entry per shard (and a sha256 per 4 MiB block: ∝ bytes, in the scaling)
            total = nbytes / bench_shards * max(2 * input_files, math.ceil(tokens / m["shard_tokens"]))
        if kind in PER_INPUT:
            count = nfiles / m["input"]["files"] * input_files if kind != "wet_input" else input_files
        elif kind == "edges":
            count = m["partitions"]
        elif kind in ("shards", "lineage"):  # ≥ one shard per partition and split; shard_tokens per shard
            per_shard = 2 if kind == "shards" else 1
            count = per_shard * max(2 * input_files, math.ceil(tokens / m["shard_tokens"]))
        else:
            count = nfiles
        files[kind] = (total, max(count, 1))

    def requests(kind: str, times: float = 1.0) -> tuple[float, float]:
        total, count = files[kind]
        size = total / count
        return total * times, count * times * max(1, math.ceil(size / PART))

    s3 = []
    for row in rows:
        name = row["phase"]
        put_bytes = put_reqs = get_bytes = get_reqs = 0.0
        for kind in WRITES.get(name, []):
            b, r = requests(kind)
            size = files[kind][0] / files[kind][1]
            put_bytes += b
            put_reqs += r + (2 * files[kind][1] if size > PART else 0)  # multipart create + complete
        for kind, how in READS.get(name, []):
            b, r = requests(kind, row["tasks"] if how == "each" else 1)
            get_bytes += b
            get_reqs += r
        wall = row["wall_hours"] * 3600
        s3.append({"phase": name, "put_bytes": put_bytes, "put_requests": put_reqs, "get_bytes": get_bytes,
                   "get_requests": get_reqs,
                   "requests_per_second": (put_reqs + get_reqs) / wall if wall >= 60 else None})

    rss = m["task_rss"]
    memory = []
    for name in ("inputs", "dedup", "cluster", "tokenizer", "tokenize", "shards", "report"):
        base = rss.get(name, rss.get("dedup", 0))
        if name == "dedup":
            grows, what = 48 * dedup_docs, f"{human(dedup_docs)} docs into dedup × 48 B (URL/content partition)"
        elif name == "cluster":
            grows, what = 80 * edges, f"{human(edges)} edges × 80 B"
        elif name in ("tokenize", "tokenizer"):
            grows, what = 25 * removed, f"{human(removed)} removed ids × 25 B (load_removed + isin)"
        elif name == "report":
            grows, what = 8 * kept + 56 * edges, f"{human(kept)} token counts × 8 B + {human(edges)} edges × 56 B"
        else:
            grows, what = 0.0, "flat (one input per task)"
        # the crawl size at which the task reaches the per-task budget (growth is linear in the crawl)
        limit = (MAX_TASK_RSS - base) / (grows / wet_tb) if grows else None
        memory.append({"phase": name, "measured": base, "at_scale": base + grows, "grows_with": what,
                       "limit_wet_tb": limit})
    tokenize_wall = next(r["wall_hours"] for r in rows if r["phase"] == "tokenize") * 3600
    removed_gets = requests("removed", tasks["tokenize"])[1] / max(tokenize_wall, 1)
    return {"rows": rows, "s3": s3, "memory": memory, "removed_gets_per_second": removed_gets, "edges": edges,
            "dedup_docs": dedup_docs, "removed": removed, "kept": kept, "tokens": tokens, "files": files}


def render(result: dict, provisional: bool, args: argparse.Namespace) -> str:
    mark = " (PROVISIONAL: docs/benchmarks.md's 2026-11-21 figures until `make bench-dataprep-scaling` runs)" \
        if provisional else " (from bench/out/dataprep-scaling.json)"
    total_cpu = sum(r["cpu_hours"] for r in result["rows"])
    total_wall = sum(r["wall_hours"] for r in result["rows"])
    out = [f"Generated by `.venv/bin/python bench/scale_model.py --write docs/scaling.md`{mark}: "
           f"{args.wet_tb:g} TB of WET, {human(args.docs)} documents, {args.input_files:,} WET files, "
           f"{args.pods:,} one-core pods.", "",
           "| phase | tasks | per-core WET MB/s | CPU-hours | wall at the pods (h) |", "|---|---|---|---|---|"]
    for r in result["rows"]:
        rate = f"{r['per_core_mb_s']:.2f}" if r["per_core_mb_s"] else "–"
        flag = " (assumed, see below)" if r["assumed"] else ""
        out.append(f"| {r['phase']} | {r['tasks']:,} | {rate} | {r['cpu_hours']:,.1f}{flag} | {r['wall_hours']:.2f} |")
    out += [f"| **total** | | | **{total_cpu:,.0f}** | **{total_wall:.1f}** |", "",
            "| phase | PUT | PUT requests | GET | GET requests | requests/s over the phase |",
            "|---|---|---|---|---|---|"]
    for r in result["s3"]:
        rate = human(r["requests_per_second"]) if r["requests_per_second"] is not None else "– (under a minute)"
        out.append(f"| {r['phase']} | {human(r['put_bytes'], 'B')} | {human(r['put_requests'])} | "
                   f"{human(r['get_bytes'], 'B')} | {human(r['get_requests'])} | {rate} |")
    out += ["", "| task | peak RSS measured | at this scale | reaches 1.5 GB at (WET) | what grows |",
            "|---|---|---|---|---|"]
    for r in result["memory"]:
        limit = "never" if r["limit_wet_tb"] is None else human(r["limit_wet_tb"] * 1e12, "B")
        out.append(f"| {r['phase']} | {human(r['measured'], 'B')} | {human(r['at_scale'], 'B')} | {limit} | "
                   f"{r['grows_with']} |")
    shards, manifest = result["files"]["shards"][1] // 2, result["files"]["manifest"][0]
    out += ["", f"Shards: {human(shards)} in one manifest of {human(manifest, 'B')} (at least one train and one "
            f"val shard per shard partition). Peak S3 rate on one key: `removed.npz`, read whole by every "
            f"tokenize task, {human(result['removed_gets_per_second'])} GET/s (S3: ~{S3_PREFIX_GETS:,} per prefix)."]
    out += ["", f"Derived: {human(result['dedup_docs'])} documents into dedup, {human(result['edges'])} duplicate "
            f"edges, {human(result['removed'])} removed, {human(result['kept'])} kept, "
            f"{human(result['tokens'])} tokens. Assumed where not measured: cluster "
            f"{CLUSTER_SECONDS_PER_EDGE * 1e9:.0f} ns of CPU per edge (when the run records no cluster phase), "
            f"the tokenizer task reading kept text at {TOKENIZER_READ_MB_S:.0f} MB/s."]
    return "\n".join(out)


def section(measured: dict, provisional: bool, scale: dict) -> str:
    """The generated part of docs/scaling.md: the tables, then what they were computed from (one
    comment line), so that check() can recompute them."""
    args = argparse.Namespace(**scale)
    text = render(model(measured, args.wet_tb, args.docs, args.pods, args.input_files), provisional, args)
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
    p.add_argument("--write", metavar="MARKDOWN", help="replace the text between the scale-model markers of this file")
    args = p.parse_args()
    measured, provisional = load(Path(args.bench))
    scale = {"wet_tb": args.wet_tb, "docs": args.docs, "pods": args.pods, "input_files": args.input_files}
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
