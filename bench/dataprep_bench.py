#!/usr/bin/env python3
"""`make bench-dataprep`: lmforge's data-prep pipeline vs Hugging Face datatrove, side by
side in one run, on the same generated WET input (≥ 200 MB uncompressed) and the same
tokenizer.json. The per-document steps are lmforge's default pipeline (or --steps) and, for
datatrove, the equivalent blocks named in STEP_TABLE; both then MinHash-dedup and tokenize.

Both run pinned to one CPU core (taskset), one process each, so their throughputs are per
core; their CPU seconds are measured too (steadier than wall time on a busy machine).
Printed: MB/s and documents/s per stage and end to end, peak RSS per worker, and the
dedup quality of each against the generator's ground truth (planted exact and near
duplicates). Results land in bench/out/dataprep-bench.json; the figures for the record go
in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "services" / "sample-data" / "src"))

from lmforge.sample_data.wet import write_sample_wet  # noqa: E402

VENV_BIN = REPO / ".venv" / "bin"
DATATROVE_PY = REPO / "bench" / ".venv-datatrove" / "bin" / "python"

# lmforge's per-document steps and datatrove's equivalent block (a key of DATATROVE_STEPS in
# bench/datatrove_baseline.py), or None where datatrove has none: that step then runs on lmforge's
# side only (extra work for lmforge, so the ratio errs against it). A step of the lmforge pipeline
# without a row here stops the bench.
STEP_TABLE: dict[str, str | None] = {
    "url_dedup": None,  # datatrove's URL dedup is a separate multi-stage job
    "exact_dedup": None,  # datatrove: exact-substring dedup is a separate job, not per document
    "langid": "langid",
    "gopher_repetition": "gopher_repetition",
    "gopher_quality": "gopher_quality",
    "pii": "pii",  # PIIFormatter: e-mails and IP addresses replaced
    "contamination": None,  # datatrove's decontamination downloads benchmark sets at run time
    "url_filter": "url_filter",
    "c4_quality": "c4_quality",
    "fineweb_quality": "fineweb_quality",
    "toxicity_words": None,  # C4BadWordsFilter downloads its word lists at run time
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=50_000, help="documents to generate (50k ≈ 205 MB of WET)")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--out", default=str(REPO / "bench" / "out"))
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--cpu", default="0", help="core(s) both pipelines are pinned to (taskset -c)")
    p.add_argument("--skip-datatrove", action="store_true")
    p.add_argument("--steps", default=None,
                   help="comma-separated lmforge pipeline steps (default: lmforge's default pipeline); datatrove "
                        "runs the equivalent blocks of STEP_TABLE")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra lmforge config override, e.g. steps.langid.sample_chars=0 (repeatable)")
    return p.parse_args()


def pipelines(steps: str | None) -> tuple[list[str], list[str], list[str]]:
    """(lmforge steps, datatrove blocks, lmforge steps without a datatrove equivalent)."""
    from lmforge.dataprep.step_registry import DEFAULT_PIPELINE

    lmforge = steps.split(",") if steps else list(DEFAULT_PIPELINE)
    missing = [step for step in lmforge if step not in STEP_TABLE]
    if missing:
        sys.exit(f"no datatrove equivalent known for {missing}: add a row to STEP_TABLE in {__file__}")
    datatrove = [STEP_TABLE[step] for step in lmforge if STEP_TABLE[step]]
    return lmforge, datatrove, [step for step in lmforge if not STEP_TABLE[step]]


def uncompressed_size(path: Path) -> int:
    total = 0
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        while block := fh.read(1 << 22):
            total += len(block)
    return total


def ensure_input(out: Path, docs: int, seed: int) -> tuple[Path, dict]:
    path = out / f"bench-{docs}-{seed}.warc.wet.gz"
    truth_path = Path(str(path) + ".truth.json")
    if not (path.exists() and truth_path.exists()):
        started = time.perf_counter()
        write_sample_wet(path, docs, seed, write_truth=True)
        print(f"generated {path} in {time.perf_counter() - started:.1f}s", flush=True)
    return path, json.loads(truth_path.read_text())


def pinned(cpu: str, command: list[str]) -> list[str]:
    return ["taskset", "-c", cpu, *command] if shutil.which("taskset") else command


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_timed(command: list[str], log_path: Path, env: dict | None = None) -> tuple[float, int, float]:
    """(wall seconds, peak RSS of the largest child process in bytes, CPU seconds of the command:
    on a busy machine the steadier measure of work per core)."""
    started, cpu_started = time.perf_counter(), _children_cpu_seconds()
    with open(log_path, "w") as log:
        proc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"command failed ({proc.returncode}): {' '.join(command)}\nsee {log_path}")
    return wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, _children_cpu_seconds() - cpu_started


def train_tokenizer(args, out: Path) -> tuple[Path, float]:
    """Both pipelines tokenize with the same tokenizer.json, trained beforehand by lmforge
    on a separate sample (another seed), so tokenizer training is not part of either run."""
    sample, _ = ensure_input(out, max(args.docs // 10, 2000), args.seed + 1)
    target = out / "tokenizer-run"
    tokenizer = target / "tokenizer.json"
    if tokenizer.exists():
        return tokenizer, json.loads((target / "work" / "stats" / "global_tokenizer.json").read_text())["seconds"]
    shutil.rmtree(target, ignore_errors=True)
    command = pinned(args.cpu, [str(VENV_BIN / "lmforge-dataprep"), "run", "--input", str(sample), "--output",
                                str(target), "--workers", "1", "--set", f"tokenizer.vocab_size={args.vocab_size}"])
    run_timed(command, out / "tokenizer-run.log")
    return tokenizer, json.loads((target / "work" / "stats" / "global_tokenizer.json").read_text())["seconds"]


def run_lmforge(args, wet: Path, out: Path, tokenizer: Path, steps: list[str]) -> dict:
    target = out / "lmforge"
    shutil.rmtree(target, ignore_errors=True)
    command = pinned(args.cpu, [str(VENV_BIN / "lmforge-dataprep"), "run", "--input", str(wet), "--output",
                                str(target), "--workers", "1", "--set", f"tokenizer.path={tokenizer}",
                                "--set", f"pipeline=[{','.join(steps)}]",
                                *(arg for override in args.overrides for arg in ("--set", override))])
    env = {**os.environ, "RAYON_NUM_THREADS": "1"}
    wall, peak, cpu = run_timed(command, out / "lmforge.log", env)
    report = json.loads((target / "report.json").read_text())
    import pyarrow.parquet as pq

    kept_urls = set()
    for path in (target / "lineage").glob("*.parquet"):
        kept_urls.update(pq.read_table(path, columns=["url"]).column("url").to_pylist())
    return {"wall_seconds": wall, "cpu_seconds": cpu, "peak_rss_bytes": peak, "report": report,
            "kept_urls": kept_urls, "tokenizer": target / "tokenizer.json"}


def run_datatrove(args, wet: Path, out: Path, tokenizer: Path, blocks: list[str]) -> dict:
    subprocess.run(["bash", str(REPO / "bench" / "setup_datatrove_venv.sh")], check=True)
    work = out / "datatrove-work"
    shutil.rmtree(work, ignore_errors=True)
    result_path = out / "datatrove.json"
    command = pinned(args.cpu, [str(DATATROVE_PY), str(REPO / "bench" / "datatrove_baseline.py"), "--input",
                                str(wet), "--tokenizer", str(tokenizer), "--workdir", str(work), "--tasks", "1",
                                "--json-out", str(result_path), "--filters", ",".join(blocks)])
    env = {**os.environ, "RAYON_NUM_THREADS": "1"}
    wall, peak, cpu = run_timed(command, out / "datatrove.log", env)
    result = json.loads(result_path.read_text())
    result["wall_seconds"] = wall
    result["cpu_seconds"] = cpu
    result["kept_urls"] = set(result.get("kept_urls", []))
    result["peak_rss_bytes"] = max(result.get("peak_rss_bytes") or 0, peak)
    return result


def dedup_quality(truth: dict, kept_urls: set[str]) -> dict:
    """Recall: planted exact/near duplicates removed. False drops: distinct good documents
    (no planted copies) missing from the output. URL duplicates share their original's
    URL, so clusters involving them are left out of this URL-based measure."""
    records = truth["records"]
    url_dup_originals = {r["original_url"] for r in records if r["kind"] == "url_dup"}
    dups = [r for r in records if r["kind"] in ("exact_dup", "near_dup") and r["original_url"] not in url_dup_originals]
    originals = {r["original_url"] for r in records if r["kind"] in ("exact_dup", "near_dup", "url_dup")}
    distinct = [r for r in records if r["kind"] in ("prose", "boilerplate", "pii") and r["url"] not in originals]
    removed = sum(1 for r in dups if r["url"] not in kept_urls)
    lost_clusters = sum(1 for url in {r["original_url"] for r in dups}
                        if url not in kept_urls and all(d["url"] not in kept_urls for d in dups
                                                        if d["original_url"] == url))
    dropped = sum(1 for r in distinct if r["url"] not in kept_urls)
    return {"planted_duplicates": len(dups), "duplicate_recall": round(removed / max(len(dups), 1), 4),
            "clusters_with_no_survivor": lost_clusters, "distinct_docs": len(distinct),
            "distinct_dropped_ratio": round(dropped / max(len(distinct), 1), 4)}


def main() -> None:
    args = parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lm_steps, dt_blocks, lmforge_only = pipelines(args.steps)
    wet, truth = ensure_input(out, args.docs, args.seed)
    raw_bytes = uncompressed_size(wet)
    print(f"input: {wet.name}: {wet.stat().st_size / 1e6:.1f} MB gz, {raw_bytes / 1e6:.1f} MB WET, "
          f"{len(truth['records'])} records", flush=True)

    tokenizer, train_seconds = train_tokenizer(args, out)
    print(f"tokenizer: {tokenizer} (vocab {args.vocab_size}; lmforge trained it in {train_seconds:.1f}s, "
          "outside both timed runs)", flush=True)
    print(f"per-document steps: lmforge {lm_steps}; datatrove {dt_blocks}; lmforge only: {lmforge_only}",
          flush=True)
    lm = run_lmforge(args, wet, out, tokenizer, lm_steps)
    report = lm["report"]
    print("\nlmforge (1 core)")
    print(f"{'stage':20s} {'docs in':>9s} {'docs out':>9s} {'seconds':>8s} {'docs/s':>9s} {'MB/s':>7s}")
    for stage in report["stages"]:
        print(f"{stage['name']:20s} {stage['docs_in']:9d} {stage['docs_out']:9d} {stage['worker_seconds']:8.2f} "
              f"{stage['docs_per_worker_second']:9.0f} {stage['text_mb_per_worker_second'] or 0:7.2f}")
    lm_e2e = raw_bytes / 1e6 / lm["wall_seconds"]
    lm_cpu = raw_bytes / 1e6 / lm["cpu_seconds"]
    worker_rss = max(w["peak_rss_bytes"] for w in report["workers"] if w["task"] != "main process")
    print(f"{'end to end':20s} {report['inputs']['records']:9d} {report['totals']['kept_docs']:9d} "
          f"{lm['wall_seconds']:8.2f} {report['inputs']['records'] / lm['wall_seconds']:9.0f} {lm_e2e:7.2f}")
    print(f"CPU: {lm['cpu_seconds']:.2f} s, {lm_cpu:.2f} MB per CPU second")
    print(f"peak RSS per worker: {worker_rss / 2**20:.0f} MiB; whole run: {lm['peak_rss_bytes'] / 2**20:.0f} MiB")
    lm_quality = dedup_quality(truth, lm["kept_urls"])
    print(f"dedup quality: {lm_quality}")

    result = {"machine": {"platform": platform.platform(), "cpu": platform.processor() or platform.machine(),
                          "cores_used": len(args.cpu.split(","))},
              "input": {"path": wet.name, "gz_bytes": wet.stat().st_size, "wet_bytes": raw_bytes,
                        "records": len(truth["records"])},
              "steps": {"lmforge": lm_steps, "datatrove": dt_blocks, "lmforge_only": lmforge_only,
                        "lmforge_overrides": args.overrides},
              "lmforge": {"wall_seconds": round(lm["wall_seconds"], 2), "mb_per_second": round(lm_e2e, 3),
                          "cpu_seconds": round(lm["cpu_seconds"], 2), "mb_per_cpu_second": round(lm_cpu, 3),
                          "docs_per_second": round(report["inputs"]["records"] / lm["wall_seconds"], 1),
                          "peak_rss_per_worker_bytes": worker_rss, "peak_rss_bytes": lm["peak_rss_bytes"],
                          "output_tokens": report["totals"]["output_tokens"], "stages": report["stages"],
                          "dedup_quality": lm_quality, "tokenizer_train_seconds": train_seconds}}
    if not args.skip_datatrove:
        dt = run_datatrove(args, wet, out, tokenizer, dt_blocks)
        dt_e2e = raw_bytes / 1e6 / dt["wall_seconds"]
        dt_cpu = raw_bytes / 1e6 / dt["cpu_seconds"]
        print("\ndatatrove (1 core)")
        for stage in dt["stages"]:
            rate = stage["docs_in"] / stage["seconds"] if stage["seconds"] else 0
            print(f"{stage['name']:20s} {stage['docs_in']:9d} {stage['docs_out']:9d} {stage['seconds']:8.2f} "
                  f"{rate:9.0f}")
        print(f"{'end to end':20s} {'':9s} {'':9s} {dt['wall_seconds']:8.2f} "
              f"{len(truth['records']) / dt['wall_seconds']:9.0f} {dt_e2e:7.2f}")
        print(f"CPU: {dt['cpu_seconds']:.2f} s, {dt_cpu:.2f} MB per CPU second")
        print(f"peak RSS: {dt['peak_rss_bytes'] / 2**20:.0f} MiB")
        dt_quality = dedup_quality(truth, dt["kept_urls"])
        print(f"dedup quality: {dt_quality}")
        speedup = lm_e2e / dt_e2e
        print(f"\nlmforge / datatrove end-to-end throughput per core: {speedup:.2f}x "
              f"(per CPU second: {lm_cpu / dt_cpu:.2f}x)")
        result["datatrove"] = {"version": dt.get("datatrove_version"), "wall_seconds": round(dt["wall_seconds"], 2),
                               "mb_per_second": round(dt_e2e, 3), "peak_rss_bytes": dt["peak_rss_bytes"],
                               "cpu_seconds": round(dt["cpu_seconds"], 2), "mb_per_cpu_second": round(dt_cpu, 3),
                               "output_tokens": dt.get("output_tokens"), "stages": dt["stages"],
                               "dedup_quality": dt_quality}
        result["speedup"] = round(speedup, 3)
        result["speedup_per_cpu_second"] = round(lm_cpu / dt_cpu, 3)
    (out / "dataprep-bench.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"\nresults: {out / 'dataprep-bench.json'}")


if __name__ == "__main__":
    main()
