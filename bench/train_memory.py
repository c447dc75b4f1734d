#!/usr/bin/env python3
"""`make bench-train-memory`: per-rank memory of DDP vs FSDP2 for 1, 2 and 4 ranks; with
`--suite layouts`, of 4-rank TP / PP / CP / EP layouts beside `lmforge-train plan`'s prediction.

Each configuration is a real trainer run (torchrun; gloo on CPU, NCCL on GPU) of a few
steps on a synthetic data-prep output. Reported per rank 0: bytes held in parameters,
gradients and optimizer state after the first step (the trainer's `memory` record), and
the peak (device memory on GPU; peak RSS of the process on CPU, which includes the
Python/torch runtime). Results: bench/out/train-memory.json and a Markdown table.

The layouts suite records every rank's state (a pipeline's stages hold different layers) and
compares the most loaded rank's with the planner's model-state bytes for the same layout
(lmforge.trainer.planner.memory, fp32 parameters, gradients and AdamW moments, as the trainer
keeps them on CPU). The planner's activation and FSDP-buffer bytes assume bf16 on a GPU: only
the state is comparable on CPU. Each layout's last step is profiled (profile.steps): the time in
each kind of collective, from the trainer's "profile" record.
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
VOCAB = 8192


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


# 4-rank layouts: (label, model, parallel degrees); the MoE rows borrow ep from dp_shard.
LAYOUTS = [
    ("dp_shard=4", "llama-debug", {"dp_shard": 4}),
    ("tp=2 × dp_shard=2", "llama-debug", {"tp": 2, "dp_shard": 2}),
    ("pp=2 × dp_shard=2", "llama-debug", {"pp": 2, "dp_shard": 2}),
    ("pp=4", "llama-debug", {"pp": 4}),
    ("pp=2 × tp=2", "llama-debug", {"pp": 2, "tp": 2}),
    ("cp=2 × dp_shard=2", "llama-debug", {"cp": 2, "dp_shard": 2}),
    ("cp=2 × tp=2", "llama-debug", {"cp": 2, "tp": 2}),
    ("MoE dp_shard=4", "moe-debug", {"dp_shard": 4}),
    ("MoE dp_shard=4, ep=2", "moe-debug", {"dp_shard": 4, "ep": 2}),
    ("MoE dp_shard=4, ep=4", "moe-debug", {"dp_shard": 4, "ep": 4}),
]
# llama-debug's heads (8 query, 2 key/value) at 4x its width and 2x its depth; untied, as a pipeline needs
LAYOUT_SHAPE = {"n_layer": 8, "n_embd": 512, "tie_embeddings": False}
PP_MICROBATCHES = 4


def run_layout(label: str, preset: str, degrees: dict[str, int], data: Path, run_dir: Path, args) -> dict:
    shape = ", ".join(f"{k}: {json.dumps(v)}" for k, v in {**LAYOUT_SHAPE, "context_length": args.seq_len}.items())
    overrides = [f"data.sources=[{{path: {data}}}]", f"data.seq_len={args.seq_len}", f"data.batch_size={args.batch}",
                 "steps=3", "profile.steps=[2]", f"model.preset={preset}", f"model.overrides={{{shape}}}",
                 f"device={args.device}",
                 f"run_dir={run_dir}", "checkpoint.every=0", "checkpoint.resume=false",
                 *(f"parallel.{axis}={degree}" for axis, degree in degrees.items())]
    if degrees.get("pp", 1) > 1:
        overrides.append(f"parallel.pp_microbatches={PP_MICROBATCHES}")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
               "-m", "lmforge.trainer", *overrides]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if result.returncode:
        raise SystemExit(f"{label} failed:\n{result.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    memory = next(r for r in records if r["kind"] == "memory")
    ranks = memory.get("ranks", [memory])  # every rank's state, when the trainer records it
    most = max(ranks, key=lambda r: r["total"])
    peak = max(rank["peak_memory_bytes"] for r in records if r["kind"] == "step" for rank in r["ranks"])
    profile = next(r for r in records if r["kind"] == "profile")  # step 2, averaged over the ranks
    return {"layout": label, "preset": preset, "degrees": degrees, "rank_totals": [r["total"] for r in ranks],
            **{k: most[k] for k in ("params", "grads", "optimizer", "total")}, "peak_bytes": peak,
            "planned": planned_state(preset, degrees, args),
            "comm": {k: profile[k] for k in ("step_seconds", "comm_seconds", "comm_total_seconds",
                                              "exposed_comm_fraction")}}


def planned_state(preset: str, degrees: dict[str, int], args) -> dict[str, float]:
    """lmforge-train plan's model-state bytes per GPU (its most loaded stage) for the same layout."""
    from lmforge.model.config import GPTConfig
    from lmforge.trainer.planner.layout import Layout
    from lmforge.trainer.planner.memory import StateConfig, memory_per_gpu
    from lmforge.trainer.planner.shape import ModelShape

    config = GPTConfig.preset(preset, **LAYOUT_SHAPE, context_length=args.seq_len, vocab_size=VOCAB)
    pp = degrees.get("pp", 1)
    layout = Layout(dp_replicate=1, dp_shard=degrees.get("dp_shard", 1), tp=degrees.get("tp", 1), pp=pp,
                    cp=degrees.get("cp", 1), ep=degrees.get("ep", 1), micro_batch=args.batch,
                    microbatches=PP_MICROBATCHES if pp > 1 else 1, activation_checkpointing=False)
    memory = memory_per_gpu(ModelShape.from_config(config), layout, args.seq_len, StateConfig())
    return {"params": memory.params, "grads": memory.grads, "optimizer": memory.optimizer,
            "total": memory.params + memory.grads + memory.optimizer}


def layouts_table(rows: list[dict], args) -> list[str]:
    mib = 2**20
    lines = [f"device {args.device}, 4 ranks, sequence {args.seq_len}, {args.batch} sequences per micro-batch, "
             f"{platform.processor() or platform.machine()}",
             "| layout | params MiB | grads MiB | optimizer MiB | state MiB (most loaded rank) | planner's state MiB | "
             "every rank's state MiB | peak RSS MiB |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        per_rank = " / ".join(f"{total / mib:.1f}" for total in row["rank_totals"])
        lines.append(f"| {row['layout']} | {row['params'] / mib:.1f} | {row['grads'] / mib:.1f} | "
                     f"{row['optimizer'] / mib:.1f} | {row['total'] / mib:.1f} | {row['planned']['total'] / mib:.1f} | "
                     f"{per_rank} | {row['peak_bytes'] / mib:.0f} |")
    return lines


def comm_table(rows: list[dict]) -> list[str]:
    """Step 2's torch.profiler trace of each layout: seconds per kind of collective (mean over ranks)."""
    kinds = sorted({kind for row in rows for kind, seconds in row["comm"]["comm_seconds"].items() if seconds})
    columns = " | ".join(f"{kind} s" for kind in kinds)
    lines = [f"| layout | step s | {columns} | communication s | exposed communication / step |",
             "|---|---|" + "---|" * len(kinds) + "---|---|"]
    for row in rows:
        comm = row["comm"]
        per_kind = " | ".join(f"{comm['comm_seconds'].get(kind, 0.0):.3f}" for kind in kinds)
        lines.append(f"| {row['layout']} | {comm['step_seconds']:.3f} | {per_kind} | "
                     f"{comm['comm_total_seconds']:.3f} | {comm['exposed_comm_fraction']:.0%} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="modes", choices=["modes", "layouts"],
                        help="modes: DDP vs FSDP2 at 1, 2, 4 ranks; layouts: 4-rank TP/PP/CP/EP beside the planner")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--out", default=str(REPO / "bench" / "out"))
    args = parser.parse_args()

    from lmforge.sample_data.token_shards import synthetic_output

    rows = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.suite == "layouts":
        with tempfile.TemporaryDirectory() as tmp:
            data = synthetic_output(Path(tmp) / "data", vocab_size=VOCAB, train_tokens=400_000)
            for index, (label, preset, degrees) in enumerate(LAYOUTS):
                rows.append(run_layout(label, preset, degrees, data, Path(tmp) / f"layout-{index}", args))
                print(json.dumps(rows[-1]), flush=True)
        print("\n".join(layouts_table(rows, args) + [""] + comm_table(rows)))
        (out / "train-memory-layouts.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
        return
    with tempfile.TemporaryDirectory() as tmp:
        data = synthetic_output(Path(tmp) / "data", vocab_size=VOCAB, train_tokens=400_000)
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
    (out / "train-memory.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
