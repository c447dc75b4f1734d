#!/usr/bin/env python3
"""`make bench-upload`: the checkpoint uploader against boto3's `upload_file` (default
settings), side by side in one run, on the same local S3 server (moto, its own process).

The checkpoint is a multi-GB directory shaped like a DCP save (one large shard per rank
plus small files), committed with the trainer's marker. Each client runs as its own
process, so its CPU time (user + system, all threads) is measured exactly with wait4:
- lmforge: `lmforge-uploader watch --exit-when-done` (multipart, parallel parts, CRC32 per
  part, sha256 of every file for the manifest, MANIFEST.json last);
- baseline: `boto3.client("s3").upload_file(...)` per file with the default TransferConfig.
Also reported: the S3 server's own CPU seconds (from /proc), to tell which side bounds the
throughput, and lmforge's commit-marker-to-manifest lag. Rounds alternate the order.
Results: bench/out/upload-bench.json and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20
BASELINE = """
import sys, boto3
from pathlib import Path
root, bucket, prefix = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
client = boto3.client("s3")
for path in sorted(p for p in root.rglob("*") if p.is_file()):
    client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(root).as_posix()}")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def run_measured(command: list[str], env: dict) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system) of the child, its stdout."""
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - started
        out.seek(0)
        text = out.read()
    if process.returncode:
        raise SystemExit(f"{command[:4]} failed:\n{text[-3000:]}")
    return wall, usage.ru_utime + usage.ru_stime, text


def empty_bucket(client) -> None:
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket="bench")
            for o in page.get("Contents", [])]
    for start in range(0, len(keys), 1000):
        client.delete_objects(Bucket="bench", Delete={"Objects": [{"Key": k} for k in keys[start : start + 1000]]})


def make_checkpoint(root: Path, ranks: int, shard_mb: int) -> int:
    step = root / "step-00000099"
    step.mkdir(parents=True)
    chunk = os.urandom(64 * MIB)
    for rank in range(ranks):
        with open(step / f"__{rank}_0.distcp", "wb") as fh:
            for _ in range(shard_mb // 64):
                fh.write(chunk[: 32 * MIB] + os.urandom(32 * MIB))  # not all equal, cheap to make
    (step / ".metadata").write_bytes(os.urandom(200_000))
    for rank in range(ranks):
        (step / f"rng-rank{rank:05d}.pt").write_bytes(os.urandom(20_000))
    (step / "meta.json").write_text(json.dumps({"step": 99, "config": {"steps": 100}}))
    (step / "COMMITTED").write_bytes(b"")
    return sum(p.stat().st_size for p in step.iterdir())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4, help="shards in the checkpoint")
    parser.add_argument("--shard-mb", type=int, default=512, help="size of each shard (multiple of 64)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="uploader config override")
    parser.add_argument("--out", default=str(REPO / "bench" / "out"))
    args = parser.parse_args()

    import boto3

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    work = Path(tempfile.mkdtemp(prefix="lmforge-upload-bench-"))
    rows = {"lmforge": [], "boto3 upload_file": []}
    try:
        for _ in range(100):
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="bench", aws_secret_access_key="bench",
                              region_name="us-east-1")
        client.create_bucket(Bucket="bench")
        size = make_checkpoint(work / "ckpt", args.ranks, args.shard_mb)
        print(f"checkpoint: {size / 2**30:.2f} GiB in {args.ranks + 2 + args.ranks} files", flush=True)
        # Warm-up, untimed: a fresh server process pays for growing its heap on the first
        # gigabytes it stores, which would penalise whichever client went first.
        run_measured([sys.executable, "-c", BASELINE, str(work / "ckpt/step-00000099"), "bench", "warm-up"], env)
        empty_bucket(client)
        for round_ in range(args.rounds):
            order = list(rows) if round_ % 2 == 0 else list(reversed(rows))
            for name in order:
                prefix = f"r{round_}-{name.split()[0]}"
                server_cpu = process_cpu_seconds(server.pid)
                if name == "lmforge":
                    command = [sys.executable, "-m", "lmforge.uploader", "watch", "--dir", str(work / "ckpt"),
                               "--dest", f"s3://bench/{prefix}", "--exit-when-done", "--set", "poll_seconds=0.2",
                               *[arg for kv in args.set for arg in ("--set", kv)]]
                    for marker in (work / "ckpt").rglob("UPLOADED"):
                        marker.unlink()
                    (work / "ckpt/step-00000099/COMMITTED").touch()  # the commit, just now
                else:
                    command = [sys.executable, "-c", BASELINE, str(work / "ckpt/step-00000099"), "bench", prefix]
                wall, cpu, output = run_measured(command, env)
                server_cpu = process_cpu_seconds(server.pid) - server_cpu
                lag = None
                if name == "lmforge":
                    match = re.search(r'"event": "uploaded".*?"lag_seconds": ([0-9.]+)', output)
                    lag = float(match.group(1)) if match else None
                rows[name].append({"wall_seconds": wall, "mb_per_second": size / MIB / wall,
                                   "client_cpu_seconds_per_gb": cpu / (size / 2**30),
                                   "server_cpu_seconds": server_cpu, "lag_seconds": lag})
                print(json.dumps({"round": round_, "client": name, **rows[name][-1]}), flush=True)
                empty_bucket(client)  # free the server's memory between runs
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    summary = {name: {k: statistics.median(r[k] for r in runs if r[k] is not None) if any(
        r[k] is not None for r in runs) else None for k in runs[0]} for name, runs in rows.items()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "upload-bench.json").write_text(json.dumps({"checkpoint_bytes": size, "rounds": rows, "median": summary,
                                                       "machine": f"{platform.machine()} {os.cpu_count()} CPUs"},
                                                      indent=1))
    print("| client | MB/s | client CPU s per GiB | S3 server CPU s | commit to manifest s |\n|---|---|---|---|---|")
    for name, s in summary.items():
        lag = f"{s['lag_seconds']:.1f}" if s["lag_seconds"] is not None else "n/a"
        print(f"| {name} | {s['mb_per_second']:.0f} | {s['client_cpu_seconds_per_gb']:.2f} | "
              f"{s['server_cpu_seconds']:.1f} | {lag} |")


if __name__ == "__main__":
    main()
