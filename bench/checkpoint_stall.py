#!/usr/bin/env python3
"""`make bench-checkpoint`: how long a checkpoint blocks the training step, asynchronous
(DCP async_save: stage to CPU memory, write in a background thread) against synchronous
(dcp.save), side by side in one run, on the same model and optimizer state.

For each mode: the stall (seconds `Checkpointer.save` blocks the caller), the time until the
checkpoint is committed, and the training steps run meanwhile. Rounds alternate the two modes.
Results: bench/out/checkpoint-stall.json and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="124m")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where checkpoints are written (default: a temp dir)")
    parser.add_argument("--out", default=str(REPO / "bench" / "out"))
    args = parser.parse_args()

    import warnings

    import torch

    from lmforge.model.config import GPTConfig
    from lmforge.model.transformer import GPT
    from lmforge.trainer.checkpoint import Checkpointer
    from lmforge.trainer.config import OptimSection
    from lmforge.trainer.optim import build_optimizer

    warnings.filterwarnings("ignore", category=UserWarning)  # DCP without a process group
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset(args.preset)).to(device)
    optimizer = build_optimizer(model, OptimSection(), fused=device.type == "cuda")
    batch = torch.randint(0, model.config.vocab_size, (1, 65), device=device)

    def step() -> None:
        _, loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # the optimizer state exists from here on
    state_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) * 3
    base = Path(args.dir or tempfile.mkdtemp(prefix="lmforge-ckpt-bench-"))
    # One Checkpointer per mode for the whole benchmark, as the trainer keeps one per run.
    checkpointers = {mode: Checkpointer(base / mode, keep=1, async_save=mode == "async") for mode in ("async", "sync")}
    results = {"async": [], "sync": []}
    for round_ in range(args.rounds):
        for mode in ("async", "sync") if round_ % 2 == 0 else ("sync", "async"):
            checkpointer = checkpointers[mode]
            started = time.perf_counter()
            stall = checkpointer.save(round_, model, optimizer, {"bench": True})
            steps_meanwhile = 0
            while checkpointer.in_flight and checkpointer.poll() is None:
                step()
                steps_meanwhile += 1
            committed = time.perf_counter() - started
            results[mode].append({"stall_seconds": stall, "commit_seconds": committed,
                                  "steps_during_save": steps_meanwhile})
            print(json.dumps({"round": round_, "mode": mode, **results[mode][-1]}), flush=True)
    for checkpointer in checkpointers.values():
        checkpointer.close()
    shutil.rmtree(base, ignore_errors=True)
    # The first save allocates the staging buffers; later ones reuse them (reported apart).
    summary = {mode: {k: statistics.median(r[k] for r in rows[1:]) for k in rows[0]} for mode, rows in results.items()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"preset": args.preset, "device": str(device), "state_bytes": state_bytes, "rounds": results,
              "median": summary, "machine": f"{platform.machine()} {os.cpu_count()} CPUs"}
    (out / "checkpoint-stall.json").write_text(json.dumps(record, indent=1))
    print(f"preset {args.preset} on {device}, model+optimizer state {state_bytes / 2**30:.2f} GiB")
    print("| save | first stall s | stall s (median of later saves) | committed after s | steps run during save |\n"
          "|---|---|---|---|---|")
    for mode in ("sync", "async"):
        s, first = summary[mode], results[mode][0]
        print(f"| {mode} | {first['stall_seconds']:.2f} | {s['stall_seconds']:.2f} | {s['commit_seconds']:.2f} | "
              f"{s['steps_during_save']:.0f} |")


if __name__ == "__main__":
    main()
