#!/usr/bin/env python3
"""`make bench-weights`: what the weights-only packages (checkpoint.weights_every, for evaluation
while training; lmforge.trainer.weights_checkpoint) cost the training loop.

The trainer (`lmforge.trainer.train`, CPU) runs the same N steps with weights packages off and on
(every --weights-every steps: the step stages the parameters, a background thread consolidates them
into a package on rank 0), in one process, alternating the two in rounds (off/on, then on/off).
Compared: the MEAN wall time from one step record to the next after warm-up (a package's cost lands
on a few steps only, so a median would hide it), and its ratio on/off. Target: <= 1.02 on CPU.
Wall time is only as good as the machine is quiet (the load average is recorded): beside it, the
process CPU time of each whole run (every thread: the step, DCP's writer, the package thread), whose
ratio on/off is what the packages cost when the trainer has the cores to itself, and which other
processes' load does not move. Also reported: the packages written and the seconds each blocked its step.

Results: bench/out/weights-overhead.json and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def config(data: Path, run_dir: Path, args, weights_every: int) -> dict:
    return {"data": {"sources": [{"path": str(data)}], "seq_len": args.seq_len, "batch_size": args.batch},
            "model": {"preset": args.preset, "overrides": {"context_length": args.seq_len, "dropout": 0.0}},
            "steps": args.steps, "device": "cpu", "run_dir": str(run_dir), "optim": {"warmup_steps": 2},
            "checkpoint": {"resume": False, "weights_every": weights_every}}


def run(data: Path, run_dir: Path, args, weights_every: int) -> tuple[list[float], list[dict], float]:
    """Step-to-step wall times (after --skip warm-up steps), the run's `weights` records, and the
    process CPU seconds of the whole run."""
    from lmforge.trainer.config import TrainConfig
    from lmforge.trainer.train import train

    cpu = time.process_time()
    train(TrainConfig.model_validate(config(data, run_dir, args, weights_every)))
    cpu = time.process_time() - cpu
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = [r["timestamp"] for r in records if r["kind"] == "step"]
    return [b - a for a, b in zip(times, times[1:])][args.skip:], [r for r in records if r["kind"] == "weights"], cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--skip", type=int, default=10, help="warm-up steps left out of each run")
    parser.add_argument("--weights-every", type=int, default=10, help="the cadence measured (steps)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                        help="torch threads (one core is left to the package thread, as a trainer pod would)")
    parser.add_argument("--out", default=str(REPO / "bench" / "out"))
    args = parser.parse_args()

    import warnings

    import torch

    from lmforge.sample_data.token_shards import synthetic_output

    warnings.filterwarnings("ignore", category=UserWarning)  # DCP without a process group
    torch.set_num_threads(args.threads)
    per_step: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    load_before = os.getloadavg()[0]
    packages: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        data = synthetic_output(Path(tmp) / "data", vocab_size=8192, train_tokens=1_000_000)
        run(data, Path(tmp) / "warm-up", argparse.Namespace(**{**vars(args), "steps": 5, "skip": 0}), 2)
        for round_ in range(args.rounds):
            means = {}
            for mode in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
                times, weights, seconds = run(data, Path(tmp) / f"{mode}-{round_}", args,
                                              args.weights_every if mode == "on" else 0)
                per_step[mode].extend(times)
                cpu[mode].append(seconds)
                means[mode] = statistics.mean(times)
                packages.extend(weights if mode == "on" else [])
            print(json.dumps({"round": round_, "mean_seconds_per_step": means,
                              "cpu_seconds": {mode: cpu[mode][-1] for mode in cpu}}), flush=True)
    off, on = statistics.mean(per_step["off"]), statistics.mean(per_step["on"])
    blocked = [p["blocked_seconds"] for p in packages if p.get("source") == "model_save"]
    result = {"preset": args.preset, "seq_len": args.seq_len, "batch": args.batch, "steps": args.steps,
              "skip": args.skip, "rounds": args.rounds, "weights_every": args.weights_every,
              "threads": args.threads, "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
              "load_average": [load_before, os.getloadavg()[0]],
              "mean_step_seconds": {"off": off, "on": on}, "ratio": on / off,
              "cpu_seconds_per_run": {k: statistics.mean(v) for k, v in cpu.items()},
              "cpu_ratio": statistics.mean(cpu["on"]) / statistics.mean(cpu["off"]),
              "median_step_seconds": {k: statistics.median(v) for k, v in per_step.items()},
              "packages": len(packages), "blocked_seconds_median": statistics.median(blocked) if blocked else None,
              "package_seconds_median": statistics.median(p["seconds"] for p in packages) if packages else None}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "weights-overhead.json").write_text(json.dumps(result, indent=1))
    print(f"preset {args.preset}, seq {args.seq_len} x batch {args.batch}, {args.threads} torch threads, "
          f"{args.rounds} rounds of {args.steps} steps, packages every {args.weights_every} steps")
    print("| weights packages | mean s/step | median s/step | packages | blocked s (median) | package s (median) |\n"
          "|---|---|---|---|---|---|")
    print(f"| off | {off:.4f} | {result['median_step_seconds']['off']:.4f} | 0 | | |")
    print(f"| on | {on:.4f} | {result['median_step_seconds']['on']:.4f} | {len(packages)} | "
          f"{result['blocked_seconds_median'] or 0:.4f} | {result['package_seconds_median'] or 0:.3f} |")
    print(f"ratio on/off: mean step time {result['ratio']:.3f} (target <= 1.02; load average "
          f"{load_before:.1f} -> {result['load_average'][1]:.1f}), process CPU time {result['cpu_ratio']:.3f}")


if __name__ == "__main__":
    main()
