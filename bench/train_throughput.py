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
each bf16 run beside what `lmforge-train plan` predicts for it; for llama-1b (--float8-preset)
also Float8 (torchao, tensorwise; goal >= 1.3x bf16's tokens/s, the ratio is printed) and
activation checkpointing on (against the bf16 row's off). `--device cpu` runs the same suite on
CPU (gloo; e.g. --preset llama-debug --seq-len 32 --batch 4 --gpu-steps 6 --no-compile: a check
of the code path, not a figure); `--dry-run` lists the runs' commands without running them.
`--runs` picks the kinds of row (plain bf16, fp32, float8, ac), so that a short GPU lease can run the
most important rows first and the rest later (bench/gpu/device_run.sh); `--baseline` then gives the
earlier result whose plain bf16 row the Float8 and checkpointing rows are set against. The JSON is
rewritten after every row, and a row that fails or outlasts --row-timeout is recorded with its
error and the suite goes on.

Results: bench/out/train-throughput-<suite>.json and a Markdown table; the gpu suite's JSON also
carries the date and the command line, and bench/record_calibration.py (which `make bench-gpu` runs
after it) adds its rows to the planner's calibration records.
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
from typing import NamedTuple

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

    from lmforge.model.transformer import GPT
    from lmforge.trainer.config import TrainConfig
    from lmforge.trainer.optim import build_optimizer, learning_rate
    from lmforge.trainer.schedule import TrainingPlan
    from lmforge.trainer.train import build_sampler

    config = TrainConfig.model_validate(trainer_config(data, Path("unused"), steps, args))
    sampler = build_sampler(config)
    batches = [torch.from_numpy(sampler.batch(i, 0, 1, args.batch)[0]) for i in range(steps)]
    torch.manual_seed(config.seed)
    model = GPT(config.model.build(vocab_size=sampler.sources[0].vocab_size))
    optimizer = build_optimizer(model, config.optim, fused=False)
    plan = TrainingPlan.of(config)
    times = []
    for step, batch in enumerate(batches):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, plan, config.optim)
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


class GpuRun(NamedTuple):
    nproc: int
    bf16: bool
    batch: int
    float8: str | None = None  # torchao's recipe
    activation_checkpointing: bool = False


def gpu_command(data: Path, run_dir: Path, args, *, preset: str, run: GpuRun) -> list[str]:
    nproc, mixed_precision, batch = run.nproc, run.bf16, run.batch
    overrides = [f"data.sources=[{{path: {data}}}]", f"data.seq_len={args.seq_len}", f"data.batch_size={batch}",
                 f"model.preset={preset}", f"model.overrides={{context_length: {args.seq_len}}}",
                 "parallel.mode=fsdp", f"parallel.compile={str(args.compile).lower()}",
                 f"parallel.mixed_precision={str(mixed_precision).lower()}", f"steps={args.gpu_steps}",
                 f"device={args.device}", f"run_dir={run_dir}", "checkpoint.resume=false", "checkpoint.every=0"]
    if run.float8:
        overrides += ["float8.enabled=true", f"float8.recipe={run.float8}"]
    if run.activation_checkpointing:
        overrides.append("parallel.activation_checkpointing=true")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "lmforge.trainer", *overrides]


def gpu_run(data: Path, run_dir: Path, args, *, preset: str, run: GpuRun) -> dict:
    command = gpu_command(data, run_dir, args, preset=preset, run=run)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ)
    try:
        _, stderr = process.communicate(timeout=args.row_timeout)
    except subprocess.TimeoutExpired:
        process.terminate()  # torchrun passes SIGTERM on to its workers
        try:
            _, stderr = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            _, stderr = process.communicate()
        raise RuntimeError(f"gpu run exceeded --row-timeout {args.row_timeout}s:\n{stderr[-3000:]}") from None
    if process.returncode:
        raise RuntimeError(f"gpu run failed:\n{stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"][args.gpu_steps // 3 :]  # past compile and warm-up
    return {"nproc": run.nproc, "bf16": run.bf16, "per_rank_batch": run.batch, "float8": run.float8,
            "activation_checkpointing": run.activation_checkpointing,
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


RUN_KINDS = ("plain", "fp32", "float8", "ac")


def gpu_runs(args, gpus: int) -> list[tuple[str, GpuRun]]:
    """Per preset: bf16 on 1 GPU (plain); for the first preset also fp32, and N GPUs for the same global
    batch when there are several (plain); for the float8 preset also Float8 (tensorwise) and activation
    checkpointing. Only the kinds in --runs."""
    kinds = set(args.runs.split(","))
    runs = []
    for index, preset in enumerate(args.preset.split(",")):
        if "plain" in kinds:
            runs.append((preset, GpuRun(1, True, args.batch)))
        if index == 0:
            if "fp32" in kinds:
                runs.append((preset, GpuRun(1, False, args.batch)))
            if "plain" in kinds and gpus > 1 and args.batch % gpus == 0:
                runs.append((preset, GpuRun(gpus, True, args.batch // gpus)))
        if preset == args.float8_preset:
            if "float8" in kinds:
                runs.append((preset, GpuRun(1, True, args.batch, float8="tensorwise")))
            if "ac" in kinds:
                runs.append((preset, GpuRun(1, True, args.batch, activation_checkpointing=True)))
    return runs


def run_name(preset: str, run: GpuRun) -> str:
    return f"{preset}-{run.nproc}-{run.bf16}-{run.float8 or 'bf16'}-{'ac' if run.activation_checkpointing else 'noac'}"


def gpu_suite(args, save=lambda result: None) -> dict:
    """Each of gpu_runs' runs, the 1-GPU bf16 ones beside the planner's prediction; then Float8's and
    activation checkpointing's tokens/s against the same preset's plain bf16 row."""
    import torch

    from lmforge.model.config import GPTConfig
    from lmforge.sample_data.token_shards import synthetic_output

    gpus = torch.cuda.device_count() if args.device == "cuda" else 1
    if not gpus:
        raise SystemExit("--suite gpu needs a CUDA device (or --device cpu for a check of the code path)")
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else f"CPU ({platform.machine()})"
    baseline = json.loads(Path(args.baseline).read_text())["rows"] if args.baseline else []
    rows, datasets = [], {}
    # when and how: bench/record_calibration.py copies both into the planner's calibration records
    started, command = time.strftime("%Y-%m-%d", time.gmtime()), " ".join(["python3", *sys.argv])

    def result() -> dict:
        return {"suite": "gpu", "device": device_name, "gpus": gpus, "presets": args.preset, "runs": args.runs,
                "seq_len": args.seq_len, "global_batch": args.batch, "compile": args.compile,
                "gpu_steps": args.gpu_steps, "date": started, "command": command, "rows": rows,
                "against_bf16": against_bf16([*rows, *baseline], args.float8_preset)}

    with tempfile.TemporaryDirectory() as tmp:
        for preset, run in gpu_runs(args, gpus):
            vocab = GPTConfig.preset(preset).vocab_size  # the data's tokens must fit the model's vocabulary
            if vocab not in datasets:
                datasets[vocab] = synthetic_output(Path(tmp) / f"data-{vocab}", vocab_size=vocab,
                                                   train_tokens=20_000_000)
            data = datasets[vocab]
            try:
                row = gpu_run(data, Path(tmp) / run_name(preset, run), args, preset=preset, run=run)
            except RuntimeError as error:  # recorded; the other rows still run
                row = {"nproc": run.nproc, "bf16": run.bf16, "per_rank_batch": run.batch, "float8": run.float8,
                       "activation_checkpointing": run.activation_checkpointing, "error": str(error)}
                print(str(error), file=sys.stderr, flush=True)
            row["preset"] = preset
            if run == GpuRun(1, True, args.batch) and "error" not in row:
                row["planner"] = planner_prediction(preset, args, device_name)
            rows.append(row)
            print(json.dumps(rows[-1])[:2000], flush=True)
            save(result())
    return result()


def against_bf16(rows: list[dict], preset: str) -> dict:
    """tokens/s and peak memory of the float8 preset's Float8 and activation-checkpointing rows over its
    plain bf16 row (absent when the suite did not run that preset)."""
    by = {}
    for r in rows:  # the first such row wins: this run's before --baseline's
        if r["preset"] == preset and r["nproc"] == 1 and r["bf16"] and "error" not in r:
            by.setdefault((r["float8"], r["activation_checkpointing"]), r)
    base = by.get((None, False))
    if base is None:
        return {}
    out = {}
    for name, key in (("float8_tensorwise", ("tensorwise", False)), ("activation_checkpointing", (None, True))):
        if key in by:
            out[name] = {"tokens_per_second_ratio": by[key]["tokens_per_second"] / base["tokens_per_second"],
                         "peak_memory_ratio": by[key]["peak_memory_bytes"] / base["peak_memory_bytes"]}
    return {"preset": preset, **out}


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
    parser.add_argument("--float8-preset", default="llama-1b", help="gpu: the preset that also runs with Float8 "
                        "(tensorwise) and with activation checkpointing")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="gpu suite: cpu checks the code "
                        "path on a machine without a GPU (no figure)")
    parser.add_argument("--dry-run", action="store_true", help="gpu: list the runs' commands, run nothing")
    parser.add_argument("--runs", default=",".join(RUN_KINDS), help="gpu: the kinds of row, a comma list of "
                        f"{', '.join(RUN_KINDS)} (default all)")
    parser.add_argument("--baseline", help="gpu: an earlier train-throughput JSON whose plain bf16 row of the "
                        "float8 preset the Float8 and checkpointing rows are compared with, if this run has none")
    parser.add_argument("--row-timeout", type=float, default=None, help="gpu: seconds one row may run")
    parser.add_argument("--tag", default="", help="suffix of the result file: train-throughput-gpu-TAG.json")
    parser.add_argument("--out", default=str(REPO / "bench" / "out"))
    args = parser.parse_args()
    gpu = args.suite == "gpu"
    args.preset = args.preset or ("350m,llama-350m,llama-1b" if gpu else "tiny")
    args.seq_len = args.seq_len or (1024 if gpu else 256)
    args.batch = args.batch or (16 if gpu else 8)
    if gpu and args.dry_run:
        for preset, run in gpu_runs(args, gpus=max(1, int(os.environ.get("BENCH_GPUS", "1")))):
            out = Path("DATA") / run_name(preset, run)
            print(" ".join(gpu_command(Path("DATA"), out, args, preset=preset, run=run)[1:]))
        return
    if unknown := set(args.runs.split(",")) - set(RUN_KINDS):
        parser.error(f"--runs: unknown {sorted(unknown)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"train-throughput-{args.suite}{'-' + args.tag if args.tag else ''}.json"

    def save(result: dict) -> None:
        result["machine"] = f"{platform.machine()} {os.cpu_count()} CPUs"
        path.write_text(json.dumps(result, indent=1))

    result = gpu_suite(args, save) if gpu else overhead_suite(args)
    save(result)
    if gpu:
        print(f"Device: {result['device']}\n\n"
              "| preset | GPUs | bf16 | float8 | act. ckpt | per-rank batch | tokens/s | MFU | planner MFU | step s "
              "| peak GiB |\n|---|---|---|---|---|---|---|---|---|---|---|")
        for r in result["rows"]:
            if "error" in r:
                print(f"| {r['preset']} | {r['nproc']} | {r['bf16']} | {r['float8'] or 'no'} | "
                      f"{'on' if r['activation_checkpointing'] else 'off'} | {r['per_rank_batch']} | "
                      "failed (see the JSON's error) | | | | |")
                continue
            mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
            plan = r.get("planner") or {}
            predicted = (f"{plan['mfu']:.0%} ({plan['mfu_range'][0]:.0%}–{plan['mfu_range'][1]:.0%})"
                         if "mfu" in plan else "")
            print(f"| {r['preset']} | {r['nproc']} | {r['bf16']} | {r['float8'] or 'no'} | "
                  f"{'on' if r['activation_checkpointing'] else 'off'} | {r['per_rank_batch']} | "
                  f"{r['tokens_per_second']:.0f} | {mfu} | {predicted} | {r['step_seconds']:.3f} | "
                  f"{r['peak_memory_bytes'] / 2**30:.1f} |")
        versus = result["against_bf16"]
        if "float8_tensorwise" in versus:
            print(f"\nFloat8 (tensorwise) / bf16 tokens/s at {versus['preset']}: "
                  f"{versus['float8_tensorwise']['tokens_per_second_ratio']:.2f}x (goal >= 1.3x)")
        if "activation_checkpointing" in versus:
            ac = versus["activation_checkpointing"]
            print(f"Activation checkpointing on / off at {versus['preset']}: tokens/s "
                  f"{ac['tokens_per_second_ratio']:.2f}x, peak memory {ac['peak_memory_ratio']:.2f}x")
    else:
        print(f"| loop | s/step | tokens/s |\n|---|---|---|\n"
              f"| bare | {result['bare_seconds_per_step']:.4f} | {result['bare_tokens_per_second']:.0f} |\n"
              f"| lmforge trainer | {result['trainer_seconds_per_step']:.4f} | "
              f"{result['trainer_tokens_per_second']:.0f} |\n\noverhead: {result['overhead_ratio']:+.2%}")


if __name__ == "__main__":
    main()
