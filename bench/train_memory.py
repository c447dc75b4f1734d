#!/usr/bin/env python3
"""`make bench-train-memory`: per-rank memory of DDP vs FSDP2 for 1, 2 and 4 ranks.

Each configuration is a real trainer run (torchrun; gloo on CPU, NCCL on GPU) of a few
steps on a synthetic data-prep output. Reported per rank 0: bytes held in parameters,
gradients and optimizer state after the first step (the trainer's `memory` record), and
the peak (device memory on GPU; peak RSS of the process on CPU, which includes the
Python/torch runtime). Results: bench/out/train-memory.json and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(mode: str, nproc: int, data: Path, run_dir: Path, args) -> dict:
    overrides = [f"data.sources=[{{path: {data}}}]", f"data.seq_len={args.seq_len}", f"data.batch_size={args.batch}",
                 f"parallel.mode={mode}", "steps=3", f"model.preset={args.preset}", f"device={args.device}",
                 f"run_dir={run_dir}", "checkpoint.every=0", "checkpoint.resume=false",
                 f"model.overrides={{context_length: {args.seq_len}}}"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "lmforge.trainer", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode:
        raise SystemExit(f"{mode} x{nproc} failed:\n{result.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    memory = next(r for r in records if r["kind"] == "memory")
    peak = max(r["peak_memory_bytes"] for r in records if r["kind"] == "step")
    return {"mode": mode, "ranks": nproc, **{k: memory[k] for k in ("params", "grads", "optimizer", "total")},
            "peak_bytes": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--out", default=str(REPO / "bench" / "out"))
    args = parser.parse_args()

    from lmforge.sample_data.token_shards import synthetic_output

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = synthetic_output(Path(tmp) / "data", vocab_size=8192, train_tokens=400_000)
        for nproc in map(int, args.ranks.split(",")):
            for mode in ("ddp", "fsdp"):
                rows.append(run(mode, nproc, data, Path(tmp) / f"{mode}-{nproc}", args))
                print(json.dumps(rows[-1]), flush=True)
    mib = 2**20
    lines = [f"preset {args.preset}, device {args.device}, {platform.processor() or platform.machine()}",
             "| ranks | mode | params MiB | grads MiB | optimizer MiB | state MiB | FSDP/DDP state | peak MiB |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        ddp = next(r for r in rows if r["ranks"] == row["ranks"] and r["mode"] == "ddp")
        lines.append(f"| {row['ranks']} | {row['mode']} | {row['params'] / mib:.1f} | {row['grads'] / mib:.1f} | "
                     f"{row['optimizer'] / mib:.1f} | {row['total'] / mib:.1f} | {row['total'] / ddp['total']:.2f} | "
                     f"{row['peak_bytes'] / mib:.0f} |")
    print("\n".join(lines))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train-memory.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
