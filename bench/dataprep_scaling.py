#!/usr/bin/env python3
"""`make bench-dataprep-scaling`: data prep at 1 and 2 workers, and per-task memory and local
disk as the input grows (issue 19).

1. Scaling. A generated WET corpus (default 205.5 MB = 50,000 documents, as `make bench-dataprep`)
   split into --files WET files (so there are tasks to share) goes through the whole pipeline,
   `lmforge-dataprep run --workers N`, twice into fresh outputs: 1 worker pinned to one core
   (taskset -c 0, RAYON_NUM_THREADS=1) and 2 workers on two (taskset -c 0,1, RAYON_NUM_THREADS=2).
   Printed per phase, from the run's own records (work/timings: wall-clock, CPU, peak RSS per
   process): wall time at 1 and 2 workers, speedup, CPU seconds, WET MB per CPU second and the
   largest peak RSS of any process or task (at 1 worker every task runs in the one process, so
   its figure for a phase is that process's peak so far); and end to end. Asserted: shards/, index/, lineage/ and
   manifest.json byte-identical between the two runs, every phase's peak RSS below --max-rss and
   the end-to-end speedup at least --min-speedup (issue 19: 1.8; timings need an idle machine).

2. Flatness. A smaller corpus (default 8 MB in 2 files) and its 4x and 16x (8 and 32 files of
   the same size) run stage by stage (stages.STAGES: inputs, combine, dedup, every components
   round, tokenizer, tokenize, shards, report) with one task per process, as Indexed-Job pods
   with one task each run them, with inputs and output on a moto S3 server and each process
   given a fresh TMPDIR. Per task: peak RSS (its wait4 rusage, taken by bench/task_launcher.py)
   and peak bytes under its TMPDIR (sampled every --disk-interval seconds). The settings are
   those a crawl would run with, scaled down (--flat-set): the tokenizer's sample capped below
   the 1x corpus (the default 64 MB cap is below a crawl's), a small minhash.task_memory_bytes so
   the auto dedup partitions and combine ranges grow with the corpus as they would at crawl scale,
   four input groups, shards of two inputs, and components.tasks growing with the corpus
   (--flat-components-tasks at 1x, times the factor: a task's share of the duplicate graph stays
   put). Asserted: each phase's largest per-task RSS and local disk flat within --flat-tolerance
   across the sizes (differences under --flat-rss-floor-mib / --flat-disk-floor-mib count as
   flat: a few MiB of a 200 MiB process are allocator noise), and RSS below --max-rss.

Results land in bench/out/dataprep-scaling.json (bench/scale_model.py takes the per-stage CPU per
WET MB and per-task memory from it into docs/scaling.md's tables). Inputs are generated once and
cached in bench/out/. Every phase the run records is reported, so phases added to the pipeline
show up without a change here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "services" / "sample-data" / "src"))

from lmforge.sample_data.wet import write_sample_wet  # noqa: E402

DATAPREP = REPO / ".venv" / "bin" / "lmforge-dataprep"
DOCS_PER_MB = 50_000 / 205.5  # the generator's density (bench/dataprep_bench.py: 50k documents ≈ 205.5 MB)
IDENTICAL = ("shards", "index", "lineage", "manifest.json")
MIB = 2**20
# The flatness runs' settings: the tokenizer's bounded sample below the 1x corpus's kept text (so it
# stays the same size); a 4 MiB task budget, so the auto dedup partitions and combine ranges grow
# with the corpus as a crawl's do with theirs; four input groups; shards of two inputs each.
FLAT_SET = ["tokenizer.sample_bytes=2097152", "minhash.task_memory_bytes=4194304", "minhash.group_objects=4",
            "shards.inputs_per_partition=2"]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=205.5, help="WET MB of the scaling corpus (issue: ≥ 200)")
    p.add_argument("--files", type=int, default=16, help="WET files the scaling corpus is split into")
    p.add_argument("--flat-mb", type=float, default=8, help="WET MB of the flatness corpus at 1x")
    p.add_argument("--flat-files", type=int, default=2, help="WET files of the flatness corpus at 1x")
    p.add_argument("--flat-factors", default="1,4,16", help="sizes of the flatness runs, as multiples of --flat-mb")
    p.add_argument("--flat-set", action="append", default=None, metavar="FIELD=VALUE",
                   help="config overrides of the flatness runs (default: " + " ".join(FLAT_SET) + ")")
    p.add_argument("--flat-components-tasks", type=int, default=1,
                   help="components.tasks of the 1x flatness run; the larger runs get this times their factor")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="config overrides of every run (lmforge-dataprep --set)")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--out", default=str(REPO / "bench" / "out"))
    p.add_argument("--min-speedup", type=float, default=1.8, help="end-to-end speedup 2 workers must reach")
    p.add_argument("--rounds", type=int, default=3,
                   help="alternating 1- and 2-worker runs; each worker count reported by its median round")
    p.add_argument("--max-rss", type=float, default=1.5e9, help="bytes a task's peak RSS must stay below")
    p.add_argument("--flat-tolerance", type=float, default=0.10, help="allowed (max - min) / min across sizes")
    p.add_argument("--flat-rss-floor-mib", type=float, default=8.0,
                   help="RSS differences below this many MiB count as flat, whatever the ratio (allocator noise)")
    p.add_argument("--flat-disk-floor-mib", type=float, default=1.0,
                   help="local disk differences below this many MiB count as flat, whatever the ratio")
    p.add_argument("--disk-interval", type=float, default=0.01, help="seconds between TMPDIR size samples")
    p.add_argument("--max-rounds", type=int, default=16, help="components rounds run at most (components.max_rounds)")
    p.add_argument("--skip-scaling", action="store_true")
    p.add_argument("--skip-flatness", action="store_true")
    return p.parse_args()


# ------------------------------------------------------------------ inputs


def _gzip_members(data: bytes, chunk: int = 1 << 16):
    """The gzip members of a WET file written one member per record, as compressed bytes."""
    view, start = memoryview(data), 0
    while start < len(data):
        inflater, fed = zlib.decompressobj(wbits=31), start
        while not inflater.eof and fed < len(data):
            inflater.decompress(view[fed:fed + chunk])  # fed in pieces: unused_data stays small
            fed = min(fed + chunk, len(data))
        if not inflater.eof:
            raise ValueError(f"truncated gzip member at byte {start}")
        end = fed - len(inflater.unused_data)
        yield bytes(view[start:end])
        start = end


def split_corpus(mb: float, files: int, seed: int, out: Path) -> list[Path]:
    """A generated WET corpus of `mb` MB as `files` WET files of consecutive records (cross-file
    duplicates stay), each with the warcinfo record first; cached under `out`."""
    docs = max(files * 4, round(mb * DOCS_PER_MB))
    folder = out / f"scaling-input-{docs}-{seed}-{files}"
    paths = [folder / f"part-{k:04d}.warc.wet.gz" for k in range(files)]
    if all(p.exists() for p in paths):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    whole = out / f"scaling-{docs}-{seed}.warc.wet.gz"
    if not whole.exists():
        started = time.perf_counter()
        write_sample_wet(whole, docs, seed)
        print(f"generated {whole.name} ({docs} documents) in {time.perf_counter() - started:.1f}s", flush=True)
    warcinfo, *records = _gzip_members(whole.read_bytes())
    for k, path in enumerate(paths):
        part = records[len(records) * k // files: len(records) * (k + 1) // files]
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(warcinfo)
            fh.writelines(part)
        os.replace(tmp, path)
    return paths


def wet_bytes(paths: list[Path]) -> int:
    return sum(len(zlib.decompress(member, wbits=31)) for path in paths for member in _gzip_members(path.read_bytes()))


# ------------------------------------------------------------------ measuring


def phase_records(output: Path) -> dict[str, list[dict]]:
    """work/timings records of a local output, by phase (every phase the run recorded)."""
    by_phase: dict[str, list[dict]] = {}
    for path in sorted((output / "work" / "timings").glob("*/*.json")):
        record = json.loads(path.read_text())
        by_phase.setdefault(record["phase"], []).append(record)
    return dict(sorted(by_phase.items(), key=lambda item: min(r["started"] for r in item[1])))


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def summarize_run(output: Path, wall: float) -> dict:
    """Per phase: wall-clock (union of its processes' intervals), CPU, processes, largest peak
    RSS of any of its processes or tasks (report.json's worker rows: per input / per tokenize task)."""
    report = json.loads((output / "report.json").read_text())
    task_rss: dict[str, int] = {}
    for row in report.get("workers", []):
        task_rss[row["phase"]] = max(task_rss.get(row["phase"], 0), int(row.get("peak_rss_bytes") or 0))
    phases = {}
    for phase, records in phase_records(output).items():
        phases[phase] = {
            "wall_seconds": round(union_seconds([(r["started"], r["ended"]) for r in records]), 3),
            "cpu_seconds": round(sum(r["cpu_seconds"] for r in records), 3),
            "processes": len(records),
            "peak_rss_bytes": max([r["peak_rss_bytes"] for r in records] + [task_rss.get(phase, 0)]),
        }
    return {"wall_seconds": round(wall, 3), "phases": phases, "report": report}


def tree_digest(output: Path) -> dict[str, str]:
    """sha256 of every file of the byte-identical part of an output, by relative path."""
    digests = {}
    for name in IDENTICAL:
        root = output / name
        for path in sorted([root] if root.is_file() else root.rglob("*")):
            if path.is_file():
                digests[str(path.relative_to(output))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


# What an output holds, by kind of file (layout.py): bench/scale_model.py scales these to S3 bytes
# and requests per stage. First match wins.
INVENTORY = (
    ("wet_input", None), ("docs", r"work/docs/"), ("dedup_keys", r"work/minhash/keys/"),
    ("signatures", r"work/minhash/.*\.sig\.npy$"), ("minhash", r"work/minhash/[^/]*\.npz$"),
    ("combined", r"work/dedup/combined/"), ("edges", r"work/dedup/edges"), ("components", r"work/dedup/components/"),
    ("removed", r"work/dedup/removed"), ("tokens", r"work/tokens/.*\.bin$"),
    ("token_index", r"work/tokens/.*\.arrow$"), ("filter_rejects", r"rejects/filter-"),
    ("dedup_rejects", r"rejects/dedup-"), ("shards", r"shards/"), ("lineage", r"lineage/"),
    ("tokenizer", r"tokenizer\.json$"), ("manifest", r"manifest\.json$"), ("report", r"report\."),
    ("small", r"work/"),
)


def output_inventory(output: Path, inputs: list[Path]) -> dict[str, dict]:
    """Files and bytes of an output by kind (INVENTORY), and the WET inputs it read."""
    inventory = {name: {"files": 0, "bytes": 0} for name, _ in INVENTORY}
    inventory["wet_input"] = {"files": len(inputs), "bytes": sum(p.stat().st_size for p in inputs)}
    for path in output.rglob("*"):
        if path.is_file():
            rel = str(path.relative_to(output))
            name = next((n for n, pattern in INVENTORY if pattern and re.match(pattern, rel)), "other")
            entry = inventory.setdefault(name, {"files": 0, "bytes": 0})
            entry["files"] += 1
            entry["bytes"] += path.stat().st_size
    return inventory


def edge_count(output: Path) -> int:
    import numpy as np

    edges = (output / "work" / "dedup").glob("edges/*/*.npy")  # layout.edges: under hash directories
    return sum(int(np.load(path, mmap_mode="r").shape[0]) for path in edges)


class Launcher:
    """bench/task_launcher.py: runs the benchmark's commands from a process that stays small (see there why)."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "task_launcher.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, command: list[str], env: dict, log: Path, tmpdir_root: Path | None = None,
            disk_interval: float = 0.01) -> dict:
        request = {"command": command, "env": env, "log": str(log), "disk_interval": disk_interval,
                   "tmpdir_root": str(tmpdir_root) if tmpdir_root else None}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        result = json.loads(self.proc.stdout.readline())
        if result["returncode"] != 0:
            sys.exit(f"command failed ({result['returncode']}): {' '.join(command)}\nsee {log}")
        return result

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def run_pipeline(launcher: Launcher, inputs: list[Path], output: Path, workers: int, cpus: str, sets: list[str],
                 log: Path) -> float:
    shutil.rmtree(output, ignore_errors=True)
    log.unlink(missing_ok=True)
    command = [str(DATAPREP), "run", "--input", *map(str, inputs), "--output", str(output), "--workers", str(workers)]
    for item in sets:
        command += ["--set", item]
    if shutil.which("taskset"):
        command = ["taskset", "-c", cpus, *command]
    env = {**os.environ, "RAYON_NUM_THREADS": str(len(cpus.split(",")))}
    return launcher.run(command, env, log)["wall_seconds"]


# ------------------------------------------------------------------ 1. scaling


def scaling(args, launcher: Launcher, out: Path) -> tuple[dict, list[str]]:
    inputs = split_corpus(args.mb, args.files, args.seed, out)
    raw = wet_bytes(inputs)
    gz = sum(p.stat().st_size for p in inputs)
    print(f"\nscaling input: {len(inputs)} files, {gz / 1e6:.1f} MB gz, {raw / 1e6:.1f} MB WET", flush=True)
    # Rounds alternate 1 and 2 workers, so a slow spell of a shared machine falls on both; each
    # worker count is reported by its median round.
    rounds: dict[int, list[tuple[float, Path]]] = {1: [], 2: []}
    for round_index in range(args.rounds):
        for workers, cpus in ((1, "0"), (2, "0,1")):
            target = out / f"scaling-{workers}w-r{round_index}"
            wall = run_pipeline(launcher, inputs, target, workers, cpus, args.set,
                                out / f"scaling-{workers}w-r{round_index}.log")
            rounds[workers].append((wall, target))
            print(f"  round {round_index}: {workers} worker(s) on cpu {cpus}: {wall:.1f}s", flush=True)
    runs, median_dirs = {}, {}
    for workers, results in rounds.items():
        wall, target = sorted(results)[len(results) // 2]
        runs[workers], median_dirs[workers] = summarize_run(target, wall), target
        runs[workers]["round_seconds"] = [round(w, 3) for w, _ in results]
    one, two = runs[1], runs[2]
    digests = {w: tree_digest(median_dirs[w]) for w in runs}
    for _, target in rounds[1] + rounds[2]:
        if tree_digest(target) != digests[1]:
            digests[2] = {}  # any round that differs fails the check below
    print(f"  median of {args.rounds}: 1 worker {one['wall_seconds']:.1f}s, 2 workers {two['wall_seconds']:.1f}s",
          flush=True)
    identical = digests[1] == digests[2] and bool(digests[1])
    report = one["report"]
    mb = raw / 1e6

    print(f"\n{'phase':12s} {'1w s':>8s} {'2w s':>8s} {'speedup':>8s} {'1w CPU s':>9s} {'MB/s/core':>10s} "
          f"{'peak RSS MiB (1w/2w)':>21s}")
    phases = {}
    for phase in dict.fromkeys([*one["phases"], *two["phases"]]):
        a, b = one["phases"].get(phase, {}), two["phases"].get(phase, {})
        speedup = a["wall_seconds"] / b["wall_seconds"] if a.get("wall_seconds") and b.get("wall_seconds") else None
        per_core = mb / a["cpu_seconds"] if a.get("cpu_seconds") else None
        phases[phase] = {"workers_1": a, "workers_2": b, "speedup": speedup and round(speedup, 3),
                         "wet_mb_per_cpu_second": per_core and round(per_core, 3)}
        print(f"{phase:12s} {a.get('wall_seconds', 0):8.2f} {b.get('wall_seconds', 0):8.2f} "
              f"{(speedup or 0):7.2f}x {a.get('cpu_seconds', 0):9.2f} {(per_core or 0):10.2f} "
              f"{a.get('peak_rss_bytes', 0) / MIB:10.0f}/{b.get('peak_rss_bytes', 0) / MIB:<10.0f}")
    e2e = one["wall_seconds"] / two["wall_seconds"]
    print(f"{'end to end':12s} {one['wall_seconds']:8.2f} {two['wall_seconds']:8.2f} {e2e:7.2f}x "
          f"{'':9s} {mb / one['wall_seconds']:10.2f}")
    print(f"byte-identical {', '.join(IDENTICAL)} at 1 and 2 workers: {identical} ({len(digests[1])} files)")

    failures = []
    if not identical:
        differ = sorted(k for k in set(digests[1]) | set(digests[2]) if digests[1].get(k) != digests[2].get(k))
        failures.append(f"outputs differ between 1 and 2 workers: {differ[:5]}")
    if e2e < args.min_speedup:
        failures.append(f"end-to-end speedup at 2 workers {e2e:.2f}x < {args.min_speedup}x")
    for phase, entry in phases.items():
        for workers in (1, 2):
            rss = entry[f"workers_{workers}"].get("peak_rss_bytes", 0)
            if rss >= args.max_rss:
                failures.append(f"{phase} at {workers} worker(s): peak RSS {rss / 1e9:.2f} GB "
                                f"≥ {args.max_rss / 1e9:.2f} GB")
    dedup = report["dedup"]
    records = report["inputs"]["records"]
    result = {
        "input": {"files": len(inputs), "gz_bytes": gz, "wet_bytes": raw, "records": records, "seed": args.seed},
        "end_to_end": {"workers_1_seconds": one["wall_seconds"], "workers_2_seconds": two["wall_seconds"],
                       "rounds": args.rounds, "workers_1_round_seconds": one["round_seconds"],
                       "workers_2_round_seconds": two["round_seconds"],
                       "speedup": round(e2e, 3), "wet_mb_per_second_1_core": round(mb / one["wall_seconds"], 3)},
        "phases": phases,
        "byte_identical": identical,
        "identical_files": len(digests[1]),
        "dedup": {"records": records, "kept_docs": report["totals"]["kept_docs"],
                  "docs_into_global_dedup": next((s["docs_in"] for s in report["stages"]
                                                  if s["name"] == "global_dedup"), None),
                  "removed_across_inputs": dedup["removed"], "within_input": dedup["within_input"],
                  "clusters": dedup["clusters"], "edges": edge_count(median_dirs[1])},
        "output_files": output_inventory(median_dirs[1], inputs),
        "config": {"minhash": report["config"].get("minhash"), "shards": report["config"].get("shards"),
                   "tokenizer": report["config"].get("tokenizer")},
        "totals": {k: report["totals"][k] for k in ("kept_docs", "kept_text_bytes", "output_tokens",
                                                    "train_shards", "val_shards", "vocab_size")},
        "tokenizer": report["tokenizer"],
    }
    return result, failures


# ------------------------------------------------------------------ 2. flatness


class MotoS3:
    """moto's S3 server on loopback, and the environment that points boto3 at it."""

    def __enter__(self):
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.endpoint, "LMFORGE_S3_ANONYMOUS": "0"}
        import boto3

        self.client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                                   aws_access_key_id="testing", aws_secret_access_key="testing")
        return self

    def __exit__(self, *exc):
        self.server.stop()


class _Env:
    """os.environ with `env` laid over it for the block (the bench reads the run back from S3)."""

    def __init__(self, env: dict):
        self.env = env

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def _task_count(output: str, stage: str, env: dict, round_: int | None = None) -> int:
    """Tasks of a split stage, from the run's recorded inputs and config (read back from S3)."""
    from lmforge.dataprep.stage_runs import open_run, stage_task_count

    with _Env(env):
        return stage_task_count(open_run(output, None, None), stage, round_)


def _round_states(output: str, env: dict, round_: int) -> set[str]:
    from lmforge.dataprep import layout
    from lmforge.dataprep.stage_runs import open_run

    with _Env(env):
        run = open_run(output, None, None)
        return {json.loads(run.store.read_text(layout.components_done(round_, t)))["state"]
                for t in range(run.config.components.tasks)}


def flat_run(args, launcher: Launcher, factor: int, inputs: str, s3: MotoS3, out: Path) -> dict:
    """Every stage of one corpus, one task per process, as Indexed-Job pods of one task each run it."""
    from lmforge.dataprep.stages import ROUNDS, STAGES

    bucket = f"scale-x{factor}"
    s3.client.create_bucket(Bucket=bucket)
    output = f"s3://{bucket}/out"
    scratch = out / f"flat-x{factor}-tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    env = {**os.environ, **s3.env, "RAYON_NUM_THREADS": "1"}
    log = out / f"flat-x{factor}.log"
    log.unlink(missing_ok=True)
    overrides = [*args.set, *args.flat_set, f"components.tasks={args.flat_components_tasks * factor}"]
    sets = [x for item in overrides for x in ("--set", item)]
    tasks: list[tuple[str, dict]] = []

    def task(phase: str, command: list[str]) -> None:
        tasks.append((phase, launcher.run([str(DATAPREP), *command, "--output", output], env, log, scratch,
                                          args.disk_interval)))

    def indexed(phase: str, command: list[str], count: int) -> None:
        for k in range(count):
            task(phase, [*command, "--worker-index", str(k), "--num-workers", str(count)])

    n_inputs = 0
    for stage in STAGES:
        if stage.name == "inputs":
            from lmforge.common.storage import expand_inputs

            with _Env(s3.env):
                n_inputs = len(expand_inputs([inputs]))
            indexed("inputs", ["run", "--input", inputs, *sets], n_inputs)
        elif stage.kind == ROUNDS:
            for r in range(args.max_rounds):
                indexed(stage.name, [stage.name, "--round", str(r)], _task_count(output, stage.name, s3.env, r))
                if _round_states(output, s3.env, r) == {"idle"}:
                    break
        elif stage.split:
            indexed(stage.name, [stage.name], _task_count(output, stage.name, s3.env))
        else:
            task(stage.name, [stage.name])
    shutil.rmtree(scratch, ignore_errors=True)

    phases: dict[str, dict] = {}
    for phase, result in tasks:
        entry = phases.setdefault(phase, {"tasks": 0, "peak_rss_bytes": 0, "peak_tmpdir_bytes": 0,
                                          "cpu_seconds": 0.0, "max_task_seconds": 0.0})
        entry["tasks"] += 1
        entry["peak_rss_bytes"] = max(entry["peak_rss_bytes"], result["peak_rss_bytes"])
        entry["peak_tmpdir_bytes"] = max(entry["peak_tmpdir_bytes"], result["peak_tmpdir_bytes"])
        entry["cpu_seconds"] = round(entry["cpu_seconds"] + result["cpu_seconds"], 3)
        entry["max_task_seconds"] = max(entry["max_task_seconds"], result["wall_seconds"])
    return phases


def flatness(args, launcher: Launcher, out: Path) -> tuple[dict, list[str]]:
    factors = [int(f) for f in args.flat_factors.split(",")]
    files = split_corpus(args.flat_mb * max(factors), args.flat_files * max(factors), args.seed + 1, out)
    file_wet = wet_bytes(files[:1])
    print(f"\nflatness input: {len(files)} files of ~{file_wet / 1e6:.1f} MB WET; sizes "
          f"{', '.join(f'{f}x = {args.flat_files * f} files' for f in factors)}; overrides {args.flat_set}", flush=True)
    results = {}
    with MotoS3() as s3:
        s3.client.create_bucket(Bucket="scale-inputs")
        for factor in factors:  # one folder per size, so a glob names its inputs and the listing their sizes
            for path in files[: args.flat_files * factor]:
                s3.client.upload_file(str(path), "scale-inputs", f"x{factor}/{path.name}")
        for factor in factors:
            started = time.perf_counter()
            results[factor] = flat_run(args, launcher, factor, f"s3://scale-inputs/x{factor}/*.warc.wet.gz", s3, out)
            print(f"  {factor}x: {args.flat_files * factor} inputs, "
                  f"{sum(e['tasks'] for e in results[factor].values())} task processes, "
                  f"{time.perf_counter() - started:.1f}s", flush=True)

    floors = {"peak_rss_bytes": args.flat_rss_floor_mib * MIB, "peak_tmpdir_bytes": args.flat_disk_floor_mib * MIB}
    print(f"\n{'phase':10s} {'tasks':>12s} {'peak RSS MiB per task':>28s} {'local disk MiB per task':>30s}")
    failures, table = [], {}
    for phase in results[factors[-1]]:
        if any(phase not in results[f] for f in factors):
            failures.append(f"{phase}: not run at every size")
            continue
        row = {"tasks": [results[f][phase]["tasks"] for f in factors]}
        for key in ("peak_rss_bytes", "peak_tmpdir_bytes"):
            values = [results[f][phase][key] for f in factors]
            spread = (max(values) - min(values)) / max(min(values), 1)
            flat = spread <= args.flat_tolerance or max(values) - min(values) < floors[key]
            row[key] = {"values": values, "spread": round(spread, 4), "flat": flat}
            if not flat:
                failures.append(f"{phase}: {key} not flat across {factors}x: "
                                f"{[round(v / MIB, 1) for v in values]} MiB (spread {spread:.0%})")
        row["cpu_seconds"] = [results[f][phase]["cpu_seconds"] for f in factors]
        for f, rss in zip(factors, row["peak_rss_bytes"]["values"]):
            if rss >= args.max_rss:
                failures.append(f"{phase} at {f}x: peak RSS {rss / 1e9:.2f} GB ≥ {args.max_rss / 1e9:.2f} GB")
        table[phase] = row
        rss_text = "/".join(f"{v / MIB:.0f}" for v in row["peak_rss_bytes"]["values"])
        disk_text = "/".join(f"{v / MIB:.1f}" for v in row["peak_tmpdir_bytes"]["values"])
        print(f"{phase:10s} {'/'.join(map(str, row['tasks'])):>12s} {rss_text:>22s} "
              f"{'' if row['peak_rss_bytes']['flat'] else 'NOT FLAT':>5s} {disk_text:>24s} "
              f"{'' if row['peak_tmpdir_bytes']['flat'] else 'NOT FLAT':>5s}")
    return {"factors": factors, "base_wet_mb": args.flat_mb, "files_at_1x": args.flat_files,
            "file_wet_bytes": file_wet, "overrides": args.flat_set, "tolerance": args.flat_tolerance,
            "floor_bytes": floors, "phases": table}, failures


def main() -> None:
    args = parse_args()
    launcher = Launcher()
    if args.flat_set is None:
        args.flat_set = FLAT_SET
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"machine": {"platform": platform.platform(), "cpu": platform.processor() or platform.machine(),
                          "cpus": os.cpu_count()},
              "date": time.strftime("%Y-%m-%d", time.gmtime()), "settings": args.set,
              "max_rss_bytes": args.max_rss}
    failures = []
    if not args.skip_scaling:
        result["scaling"], problems = scaling(args, launcher, out)
        failures += problems
    if not args.skip_flatness:
        result["flatness"], problems = flatness(args, launcher, out)
        failures += problems
    launcher.close()
    result["failures"] = failures
    path = out / "dataprep-scaling.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"\nresults: {path}")
    if failures:
        sys.exit("FAILED:\n  " + "\n  ".join(failures))


if __name__ == "__main__":
    main()
