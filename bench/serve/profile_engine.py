#!/usr/bin/env python3
"""Where an engine step's time goes, without HTTP: the serving benchmark's package and prompt
mix, 64 requests of 64 tokens (temperature 1, logprobs=0 as the load generator asks), run
through `Engine.step()` in this process at max_running 1, 16 and 64, under torch.profiler.

Prints tokens/s of the bare engine and, per step (unprofiled, wall clock): the whole step, the
packed forward (model.forward_paged) and the host time OUTSIDE it, split into the scheduler, the
model runner's own work (its inputs and the attention plan: execute less forward and sampling),
the batched sampling and the engine's bookkeeping. Then, profiled, the forward's aten ops (linear,
attention, the gather's `aten::index_select`, the cache write `aten::index_copy_`, ...). One
thread (OMP_NUM_THREADS=1) unless --threads.

--runner rebuild runs the model runner as it was before the persistent batch
(rebuild_model_runner.py: inputs rebuilt from Python lists each step, gather attention);
--attention picks the persistent runner's attention backend (gather, flex, auto).

    python bench/serve/profile_engine.py [--threads 1] [--requests 64] [--max-tokens 64] \
        [--runner persistent|rebuild] [--attention auto|gather|flex] [--max-running 1 16 64] \
        [--device cpu|cuda] [--no-cuda-graphs] [--no-profile]

On CUDA the regions are timed with a device sync around each (the work, not its launch), and a
decode step replayed from a CUDA graph counts as the forward.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

REGIONS = ("schedule", "forward", "sample", "execute")


def run(engine_cls, model, prompts, args, max_running: int, profile: bool, requests: int | None = None):
    import torch
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    from lmforge.inference import model_runner
    from lmforge.inference.sampling import SamplingParams

    engine = engine_cls(model, max_running=max_running, max_waiting=10_000, attention=args.attention,
                        cuda_graphs=not args.no_cuda_graphs)
    if args.runner == "rebuild":
        from rebuild_model_runner import RebuildModelRunner

        engine.runner = RebuildModelRunner(model, engine.cache)
    for i in range(requests or args.requests):
        engine.add(prompts[i % len(prompts)],
                   SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=i, logprobs=0))
    runner = engine.runner
    original_forward, original_sample = model.forward_paged, model_runner.sample_batch
    original_schedule, original_execute = engine.scheduler.schedule, runner.execute
    seconds = dict.fromkeys(REGIONS, 0.0)

    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)  # time the work, not its launch

    def traced(name, function):
        def call(*a, **k):
            sync()
            started = time.perf_counter()
            with record_function(name):
                result = function(*a, **k)
            sync()
            seconds[name] += time.perf_counter() - started
            return result
        return call

    model.forward_paged = traced("forward", original_forward)
    model_runner.sample_batch = traced("sample", original_sample)
    engine.scheduler.schedule = traced("schedule", original_schedule)
    runner.execute = traced("execute", original_execute)
    if getattr(runner, "graphs", None) is not None:  # a replayed decode step is the forward too
        runner.graphs.run = traced("forward", runner.graphs.run)
    steps = tokens = 0
    try:
        context = torch_profile(activities=[ProfilerActivity.CPU]) if profile else None
        started = time.perf_counter()
        if context is not None:
            context.__enter__()
        while engine.has_work():
            tokens += len(engine.step())
            steps += 1
        wall = time.perf_counter() - started
        if context is not None:
            context.__exit__(None, None, None)
    finally:
        model.forward_paged, model_runner.sample_batch = original_forward, original_sample
    per_step = {name: value / steps * 1000 for name, value in seconds.items()}
    per_step["runner"] = per_step["execute"] - per_step["forward"] - per_step["sample"]
    per_step["outside"] = wall / steps * 1000 - per_step["forward"]
    per_step["engine"] = per_step["outside"] - per_step["schedule"] - per_step["runner"] - per_step["sample"]
    return {"steps": steps, "tokens": tokens, "wall": wall, "profile": context, "ms": per_step}


def breakdown(prof, steps: int) -> tuple[dict, dict]:
    """(region → ms per step, aten op inside the forward → self ms per step)."""
    events = prof.events()
    regions = defaultdict(float)
    for event in events:
        if event.name in REGIONS:
            regions[event.name] += event.cpu_time_total / 1000 / steps
    decode_ops = defaultdict(float)
    spans = [(e.time_range.start, e.time_range.end) for e in events if e.name == "forward"]
    spans.sort()
    import bisect

    starts = [s for s, _ in spans]
    for event in events:
        if not event.name.startswith("aten::"):
            continue
        i = bisect.bisect_right(starts, event.time_range.start) - 1
        if i >= 0 and event.time_range.end <= spans[i][1]:
            decode_ops[event.name] += event.self_cpu_time_total / 1000 / steps
    return dict(regions), dict(sorted(decode_ops.items(), key=lambda kv: -kv[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-running", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--runner", choices=["persistent", "rebuild"], default="persistent")
    parser.add_argument("--attention", choices=["auto", "gather", "flex"], default="auto")
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled run (the aten-op split)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: the model in bfloat16")
    parser.add_argument("--no-cuda-graphs", action="store_true", help="on CUDA: every step eager")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from serve_bench import PROMPTS, REPO, SUITES, build_package, prompt_mix
    from tokenizers import Tokenizer

    from lmforge.inference.engine import Engine
    from lmforge.model.package import load_package

    work = REPO / "bench" / "out" / "serve"
    work.mkdir(parents=True, exist_ok=True)
    suite = SUITES["cpu"]
    package, texts = build_package(work, suite["presets"][0], suite["context_length"])
    prompts, _ = prompt_mix(texts, package / "tokenizer.json", PROMPTS, suite["prompt_tokens"])
    tokenizer = Tokenizer.from_file(str(package / "tokenizer.json"))
    prompt_ids = [tokenizer.encode(p, add_special_tokens=False).ids for p in prompts]
    model, _ = load_package(package, device=args.device)
    if args.device == "cuda":
        model = model.to(torch.bfloat16)
    results = {}
    print(f"runner {args.runner}, attention {args.attention}, {args.device}, {args.threads} thread(s)")
    for n in args.max_running:
        run(Engine, model, prompt_ids, args, n, profile=False)  # warm-up
        plain = run(Engine, model, prompt_ids, args, n, profile=False)
        results[n] = plain
        ms = plain["ms"]
        print(f"\nmax_running={n}: {plain['tokens']} tokens in {plain['wall']:.2f} s = "
              f"{plain['tokens'] / plain['wall']:.0f} tokens/s, {plain['steps']} steps, "
              f"{plain['wall'] / plain['steps'] * 1000:.2f} ms/step (unprofiled)")
        print(f"  per step, ms: forward {ms['forward']:.3f}, outside the forward {ms['outside']:.3f} = schedule "
              f"{ms['schedule']:.3f} + runner {ms['runner']:.3f} + sample {ms['sample']:.3f} + engine "
              f"{ms['engine']:.3f}")
        if args.no_profile:
            continue
        # a shorter run under the profiler (its trace is slow to read back): 2 waves of requests
        profiled = run(Engine, model, prompt_ids, args, n, profile=True, requests=max(16, 2 * n))
        _, ops = breakdown(profiled["profile"], profiled["steps"])
        print("  forward, self ms per step by op (profiled): " +
              ", ".join(f"{k[6:]} {v:.2f}" for k, v in list(ops.items())[:10]))
    if len(results) >= 2:
        low, high = (results[n] for n in (min(results), max(results)))
        print(f"\nbare-engine ratio max_running {max(results)}/{min(results)}: "
              f"{(high['tokens'] / high['wall']) / (low['tokens'] / low['wall']):.2f}x")


if __name__ == "__main__":
    main()
