#!/usr/bin/env python3
"""`make bench-train-throughput`: training tokens/s, and what the trainer costs over a bare loop.

--suite overhead (default; CPU): the trainer (`lmforge.trainer.train`: prefetching data
loader, per-step logging, metrics.jsonl, Prometheus gauges, non-finite guard) against a bare
loop doing the same forward/backward/clip/AdamW step on batches already in memory. Same model,
same seed, same thread count, in one process, alternating A/B rounds. Compared: the
median over the steps after warm-up of the wall time from one step to the next (for the trainer,
between its step records, so logging and checkpoint polling count). Target: overhead <= 5%.

--suite gpu (one or more CUDA devices): the trainer's own step records (tokens/s, MFU from
the datasheet peak), sequence 1024, FSDP, torch.compile, for the GPT-style 350m (bf16 vs fp32,
then 1 vs N GPUs for the same global batch) and the Llama-style llama-350m and llama-1b (bf16),
each bf16 run beside what `lmforge-train plan` predicts for it.

Results: bench/out/train-throughput-<suite>.json and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def trainer_config(data: Path, run_dir: Path, steps: int, args, **extra) -> dict:
    return {"data": {"sources": [{"path": str(data)}], "seq_len": args.seq_len, "batch_size": args.batch},
            "model": {"preset": args.preset, "overrides": {"context_length": args.seq_len, "dropout": 0.0}},
            "steps": steps, "device": "cpu", "run_dir": str(run_dir), "optim": {"warmup_steps": 2},
            "checkpoint": {"resume": False, "async_save": False}, **extra}


def trainer_step_times(data: Path, run_dir: Path, steps: int, args) -> list[float]:
    """Wall time between consecutive step records: everything the loop does per step."""
    from lmforge.trainer.config import TrainConfig
    from lmforge.trainer.train import train

    train(TrainConfig.model_validate(trainer_config(data, run_dir, steps, args)))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = [r["timestamp"] for r in records if r["kind"] == "step"]
    return [b - a for a, b in zip(times, times[1:])]


def bare_step_times(data: Path, steps: int, args) -> list[float]:
    """The same forward/backward/step with nothing around it; batches pre-loaded in memory."""
    import torch

    from lmforge.common.model import GPT
    from lmforge.trainer.config import TrainConfig
    from lmforge.trainer.optim import build_optimizer, learning_rate
    from lmforge.trainer.train import build_sampler

    config = TrainConfig.model_validate(trainer_config(data, Path("unused"), steps, args))
    sampler = build_sampler(config, [data])
    batches = [torch.from_numpy(sampler.batch(i, 0, 1, args.batch)[0]) for i in range(steps)]
    torch.manual_seed(config.seed)
    model = GPT(config.model.build(vocab_size=sampler.sources[0].vocab_size))
    optimizer = build_optimizer(model, config.optim, fused=False)
    times = []
    for step, batch in enumerate(batches):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, config.optim)
        _, loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.time())
    return [b - a for a, b in zip(times, times[1:])]


def overhead_suite(args) -> dict:
    import torch

    from lmforge.sample_data.token_shards import synthetic_output

    torch.set_num_threads(args.threads)
    per_step = {"trainer": [], "bare": []}
    with tempfile.TemporaryDirectory() as tmp:
        data = synthetic_output(Path(tmp) / "data", vocab_size=8192, train_tokens=2_000_000)
        bare_step_times(data, 3, args)  # warm-up: allocator, kernels, page cache
        for round_ in range(args.rounds):
            medians = {}
            for name in (("trainer", "bare") if round_ % 2 == 0 else ("bare", "trainer")):
                if name == "trainer":
                    times = trainer_step_times(data, Path(tmp) / f"r{round_}", args.steps, args)
                else:
                    times = bare_step_times(data, args.steps, args)
                times = times[args.skip :]  # warm-up steps
                per_step[name].extend(times)
                medians[name] = statistics.median(times)
            print(json.dumps({"round": round_, "median_seconds_per_step": medians}), flush=True)
    tokens = args.batch * args.seq_len
    trainer, bare = statistics.median(per_step["trainer"]), statistics.median(per_step["bare"])
    return {"suite": "overhead", "preset": args.preset, "seq_len": args.seq_len, "batch": args.batch,
            "threads": args.threads, "steps_measured": {k: len(v) for k, v in per_step.items()},
            "trainer_seconds_per_step": trainer, "bare_seconds_per_step": bare,
            "trainer_tokens_per_second": tokens / trainer, "bare_tokens_per_second": tokens / bare,
            "overhead_ratio": trainer / bare - 1}


def gpu_run(data: Path, run_dir: Path, args, *, preset: str, nproc: int, mixed_precision: bool,
            batch: int) -> dict:
    overrides = [f"data.sources=[{{path: {data}}}]", f"data.seq_len={args.seq_len}", f"data.batch_size={batch}",
                 f"model.preset={preset}", f"model.overrides={{context_length: {args.seq_len}}}",
                 "parallel.mode=fsdp", f"parallel.compile={str(args.compile).lower()}",
                 f"parallel.mixed_precision={str(mixed_precision).lower()}", f"steps={args.gpu_steps}",
                 "device=cuda", f"run_dir={run_dir}", "checkpoint.resume=false", "checkpoint.every=0"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "lmforge.trainer", *overrides]
    result = subprocess.run(command, capture_output=True, text=True, env=os.environ)
    if result.returncode:
        raise SystemExit(f"gpu run failed:\n{result.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"][args.gpu_steps // 3 :]  # past compile and warm-up
    return {"nproc": nproc, "bf16": mixed_precision, "per_rank_batch": batch,
            "tokens_per_second": statistics.median(r["tokens_per_second"] for r in steps),
            "mfu": statistics.median(r["mfu"] for r in steps) if steps[0]["mfu"] is not None else None,
            "step_seconds": statistics.median(r["step_seconds"] for r in steps),
            "peak_memory_bytes": max(r["peak_memory_bytes"] for r in steps)}


def planner_prediction(preset: str, args, device_name: str) -> dict | None:
    """What `lmforge-train plan` predicts for this run on one GPU (None for a GPU it does not know)."""
    from lmforge.trainer.planner.hardware import GPUS

    gpu = next((key for key in GPUS if key in device_name), None)
    if gpu is None:
        return None
    command = [sys.executable, "-m", "lmforge.trainer.cli", "plan", "--model", preset,
               "--seq-len", str(args.seq_len), "--gpu", gpu,
               "--nodes", "1", "--gpus-per-node", "1", "--global-batch-sequences", str(args.batch),
               "--micro-batch", str(args.batch), "--activation-checkpointing", "off", "--format", "json"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        return {"error": result.stderr.strip()[-300:]}
    step = json.loads(result.stdout)["recommended"]["step"]
    return {"gpu": gpu, "mfu": step["mfu"], "mfu_range": step["mfu_range"], "step_seconds": step["step_seconds"]}


def gpu_suite(args) -> dict:
    """Per preset: bf16 on 1 GPU beside the planner's prediction; for the first preset also fp32,
    and N GPUs for the same global batch when there are several."""
    import torch

    from lmforge.common.model import GPTConfig
    from lmforge.sample_data.token_shards import synthetic_output

    gpus = torch.cuda.device_count()
    if not gpus:
        raise SystemExit("--suite gpu needs a CUDA device")
    device_name = torch.cuda.get_device_name(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for index, preset in enumerate(args.preset.split(",")):
            vocab = GPTConfig.preset(preset).vocab_size  # the data's tokens must fit the model's vocabulary
            data = synthetic_output(Path(tmp) / f"data-{vocab}", vocab_size=vocab, train_tokens=20_000_000)
            runs = [(1, True, args.batch)]
            if index == 0:
                runs.append((1, False, args.batch))
                if gpus > 1 and args.batch % gpus == 0:
                    runs.append((gpus, True, args.batch // gpus))
            for nproc, bf16, batch in runs:
                row = gpu_run(data, Path(tmp) / f"{preset}-{nproc}-{bf16}", args, preset=preset, nproc=nproc,
                              mixed_precision=bf16, batch=batch)
                row["preset"] = preset
                if nproc == 1 and bf16:
                    row["planner"] = planner_prediction(preset, args, device_name)
                rows.append(row)
                print(json.dumps(rows[-1]), flush=True)
    return {"suite": "gpu", "device": device_name, "gpus": gpus, "presets": args.preset,
            "seq_len": args.seq_len, "global_batch": args.batch, "compile": args.compile, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=["overhead", "gpu"], default="overhead")
    parser.add_argument("--preset", default=None, help="default: tiny (overhead); gpu: a comma list, default "
                        "350m,llama-350m,llama-1b")
    parser.add_argument("--seq-len", type=int, default=None, help="default: 256 (overhead), 1024 (gpu)")
    parser.add_argument("--batch", type=int, default=None, help="sequences per step; default 8 (overhead), 16 (gpu)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60, help="steps per run (overhead suite)")
    parser.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the medians")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--gpu-steps", type=int, default=60)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--out", default=str(REPO / "bench" / "out"))
    args = parser.parse_args()
    gpu = args.suite == "gpu"
    args.preset = args.preset or ("350m,llama-350m,llama-1b" if gpu else "tiny")
    args.seq_len = args.seq_len or (1024 if gpu else 256)
    args.batch = args.batch or (16 if gpu else 8)
    result = gpu_suite(args) if gpu else overhead_suite(args)
    result["machine"] = f"{platform.machine()} {os.cpu_count()} CPUs"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"train-throughput-{args.suite}.json").write_text(json.dumps(result, indent=1))
    if gpu:
        print("| preset | GPUs | bf16 | per-rank batch | tokens/s | MFU | planner MFU | step s | peak GiB |\n"
              "|---|---|---|---|---|---|---|---|---|")
        for r in result["rows"]:
            mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
            plan = r.get("planner") or {}
            predicted = (f"{plan['mfu']:.0%} ({plan['mfu_range'][0]:.0%}–{plan['mfu_range'][1]:.0%})"
                         if "mfu" in plan else "")
            print(f"| {r['preset']} | {r['nproc']} | {r['bf16']} | {r['per_rank_batch']} | "
                  f"{r['tokens_per_second']:.0f} | {mfu} | {predicted} | {r['step_seconds']:.3f} | "
                  f"{r['peak_memory_bytes'] / 2**30:.1f} |")
    else:
        print(f"| loop | s/step | tokens/s |\n|---|---|---|\n"
              f"| bare | {result['bare_seconds_per_step']:.4f} | {result['bare_tokens_per_second']:.0f} |\n"
              f"| lmforge trainer | {result['trainer_seconds_per_step']:.4f} | "
              f"{result['trainer_tokens_per_second']:.0f} |\n\noverhead: {result['overhead_ratio']:+.2%}")


if __name__ == "__main__":
    main()
