#!/usr/bin/env python3
"""Where an engine step's time goes, without HTTP: the serving benchmark's package and prompt
mix, 64 requests of 64 tokens (temperature 1, logprobs=0 as the load generator asks), run
through `Engine.step()` in this process at max_running 1 and 16, under torch.profiler.

Prints tokens/s of the bare engine and, per step, the milliseconds in each part: the
scheduler, the packed forward (prompt chunks and decodes together; split by aten op: linear,
attention, the paged KV cache's gather `aten::index_select` and write `aten::index_copy_`, ...)
and the batched sampling. One thread
(OMP_NUM_THREADS=1) unless --threads.

    python bench/serve/profile_engine.py [--threads 1] [--requests 64] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

REGIONS = ("schedule", "forward", "sample")


def run(engine_cls, model, prompts, args, max_running: int, profile: bool, requests: int | None = None):
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    from lmforge.inference import model_runner
    from lmforge.inference.sampling import SamplingParams

    engine = engine_cls(model, max_running=max_running, max_waiting=10_000)
    for i in range(requests or args.requests):
        engine.add(prompts[i % len(prompts)],
                   SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=i, logprobs=0))
    original_forward, original_sample = model.forward_paged, model_runner.sample_batch
    original_schedule = engine.scheduler.schedule

    def traced(name, function):
        def call(*a, **k):
            with record_function(name):
                return function(*a, **k)
        return call

    model.forward_paged = traced("forward", original_forward)
    model_runner.sample_batch = traced("sample", original_sample)
    engine.scheduler.schedule = traced("schedule", original_schedule)
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
    return {"steps": steps, "tokens": tokens, "wall": wall, "profile": context}


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
    parser.add_argument("--max-running", type=int, nargs="+", default=[1, 16])
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
    package, texts = build_package(work, suite["preset"], suite["context_length"])
    prompts, _ = prompt_mix(texts, package / "tokenizer.json", PROMPTS, suite["prompt_tokens"])
    tokenizer = Tokenizer.from_file(str(package / "tokenizer.json"))
    prompt_ids = [tokenizer.encode(p, add_special_tokens=False).ids for p in prompts]
    model, _ = load_package(package)
    results = {}
    for n in args.max_running:
        run(Engine, model, prompt_ids, args, n, profile=False)  # warm-up
        plain = run(Engine, model, prompt_ids, args, n, profile=False)
        # a shorter run under the profiler (its trace is slow to read back): 2 waves of requests
        profiled = run(Engine, model, prompt_ids, args, n, profile=True, requests=max(16, 2 * n))
        regions, ops = breakdown(profiled["profile"], profiled["steps"])
        results[n] = plain
        print(f"\nmax_running={n}: {plain['tokens']} tokens in {plain['wall']:.2f} s = "
              f"{plain['tokens'] / plain['wall']:.0f} tokens/s, {plain['steps']} steps, "
              f"{plain['wall'] / plain['steps'] * 1000:.2f} ms/step (unprofiled)")
        print(f"  per step (profiled, {profiled['steps']} steps, ms): " +
              ", ".join(f"{k} {v:.2f}" for k, v in regions.items()))
        print("  forward, self ms per step by op: " +
              ", ".join(f"{k[6:]} {v:.2f}" for k, v in list(ops.items())[:10]))
    if len(results) == 2:
        low, high = (results[n] for n in sorted(results))
        print(f"\nbare-engine ratio: {(high['tokens'] / high['wall']) / (low['tokens'] / low['wall']):.2f}x")


if __name__ == "__main__":
    main()
