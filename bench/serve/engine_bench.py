#!/usr/bin/env python3
"""`make bench-serve-engine`: the paged engine against today's slot-per-sequence engine (issue 21's
CPU figures), side by side in one run, without HTTP: each side is this script in `--worker` mode, a
subprocess that builds the `tiny` preset with random weights (seed 0) and drives `Engine.step()` in
process on one thread (torch.set_num_threads(1)).

Sides:
  old  today's engine: `git archive --baseline-rev services/` extracted into a temp dir, its
       services/*/src on PYTHONPATH (lmforge is a namespace package; the worker also drops the
       venv's editable lmforge paths, so nothing of the working tree leaks in)
  new  the working tree's services/*/src
Both get the SAME KV-cache memory budget: old's is its slots x context x bytes per token (the
cache class's `bytes_per_token`); the new engine gets `kv_cache_bytes` equal to it and max_running
256, so its admission is bounded by blocks, not slots (each side's `cache_bytes` is in the JSON).
Keyword arguments only the paged engine has (kv_cache_bytes, max_batched_tokens, prefix_caching)
are passed only where the worker finds them in Engine's signature, so the harness also runs with
today's engine on both sides (the JSON's `paged` says which engine each side ran).
eos_id=None: every request runs to max_tokens (checked).

Figures (goals from issue 21):
 1. Concurrent sequences admitted: a backlog of N requests drains (all queued at t=0); mean
    (time-weighted, while the backlog waits) and peak running sequences, tokens/s. Context 256 (the
    demo's, tiny's preset), old with 8 slots. Mixes: typical = prompts 16..64, outputs 32..64 tokens;
    long = prompts 96..160, outputs 32..64. Goal: new/old mean running >= 4x (typical mix).
 2. Tokens/s with 16 and 64 requests kept in flight (a new one submitted when one finishes), typical
    mix; old with 16 / 64 slots, new with the same bytes.
 3. One 2,048-token prompt arriving among 16 decoding sequences (context 4096, old with 17 slots; new
    with max_batched_tokens 32, 48, 64, 128 and 512): its TTFT; the decoders' inter-token gap p95, longest
    gap and per-request TPOT p95 over the window (the steps from its arrival to its first token)
    against the same steps of a run without it; their gap p95 while it then decodes. Goal (chunked
    prefill): the decoders' TPOT p95 no more than 2x the run without the long prompt.
 4. Prompts sharing a 512-token prefix with distinct 32-token suffixes, one at a time (context 1024):
    TTFT with prefix caching against the new engine without it and against old. Goal: >= 3x lower.

    python bench/serve/engine_bench.py [--baseline-rev REV] [--figures 1,2,3,4] [--rounds 3] [--scale 1]

Results: a Markdown table on stdout and bench/out/engine-bench.json.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from baseline_tree import extract_baseline, isolate_sources, resolve_rev, source_dirs, sources_env  # noqa: E402
from loadgen import percentile  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "bench" / "out" / "engine-bench.json"
BASELINE_REV = "7c8248c23d0e3bbd8e77f5694ca3e7deb604762d"  # main before the paged engine (issue 21)

BUDGET_SEQUENCES = {1: 8, 3: 17, 4: 4}  # old engine's slots (the memory budget) per figure; figure 2: C slots
MIXES = {"typical": ((16, 64), (32, 64)), "long": ((96, 160), (32, 64))}  # (prompt, output) token ranges
NEW_MAX_RUNNING = 256
LONG_PROMPT = 2048
DECODERS = 16
PREFIX, SUFFIX = 512, 32
WORKER_TIMEOUT = 600


# ------------------------------------------------------------------------------------------------
# worker: runs inside one side's subprocess


def requests(seed: int, count: int, mix: str, vocab: int) -> list[tuple[list[int], int]]:
    """(prompt token ids, max_tokens) for `count` requests of `mix`; the same on both sides."""
    import random

    rng = random.Random(seed)
    (p_lo, p_hi), (o_lo, o_hi) = MIXES[mix]
    return [([rng.randrange(1, vocab) for _ in range(rng.randint(p_lo, p_hi))], rng.randint(o_lo, o_hi))
            for _ in range(count)]


class Side:
    """One engine implementation (whichever lmforge is importable) and the model it serves."""

    def __init__(self):
        import importlib
        import importlib.util
        import inspect

        import torch

        from lmforge.inference import engine as engine_module
        from lmforge.inference.sampling import SamplingParams

        # a revision before lmforge.model (issue 32) kept the model in lmforge.common
        if importlib.util.find_spec("lmforge.common.kv_cache"):
            modules = ("lmforge.common.kv_cache", "lmforge.common.model_config", "lmforge.common.model")
        else:
            modules = ("lmforge.model.kv_cache", "lmforge.model.config", "lmforge.model.transformer")
        kv_cache, config_module, model_module = map(importlib.import_module, modules)
        GPTConfig, GPT = config_module.GPTConfig, model_module.GPT

        # today's slot cache is KVCache, the paged one PagedKVCache: both say bytes_per_token
        cache_class = getattr(kv_cache, "KVCache", None) or kv_cache.PagedKVCache
        self.torch, self.GPT, self.GPTConfig, self.bytes_per_token = torch, GPT, GPTConfig, cache_class.bytes_per_token
        self.Engine, self.SamplingParams = engine_module.Engine, SamplingParams
        self.engine_file = engine_module.__file__
        self.accepts = set(inspect.signature(self.Engine).parameters)
        self.paged = "kv_cache_bytes" in self.accepts
        self._models = {}

    def model(self, context_length: int):
        if context_length not in self._models:
            self.torch.manual_seed(0)
            config = self.GPTConfig.preset("tiny", context_length=context_length)
            self._models[context_length] = self.GPT(config).eval()
        return self._models[context_length]

    def budget_bytes(self, context_length: int, old_slots: int) -> int:
        config = self.model(context_length).config
        return old_slots * context_length * self.bytes_per_token(config)

    def engine(self, context_length: int, old_slots: int, **paged_kwargs):
        """Today's engine with `old_slots` slots, or the paged one with the same bytes; paged-only
        keyword arguments are dropped where the engine does not take them."""
        model = self.model(context_length)
        if not self.paged:
            return self.Engine(model, max_running=old_slots, max_waiting=1_000_000, eos_id=None), {}
        kwargs = {"kv_cache_bytes": self.budget_bytes(context_length, old_slots), **paged_kwargs}
        kwargs = {k: v for k, v in kwargs.items() if k in self.accepts and v is not None}
        return self.Engine(model, max_running=NEW_MAX_RUNNING, max_waiting=1_000_000, eos_id=None, **kwargs), kwargs

    def params(self, max_tokens: int, seed: int):
        return self.SamplingParams(max_tokens=max_tokens, temperature=0.0, seed=seed)


def engine_facts(engine) -> dict:
    facts = {"cache_bytes": engine.cache.bytes}
    stats = getattr(engine, "stats", None)
    if callable(stats):
        s = stats()
        facts.update({name: getattr(s, name) for name in ("preemptions", "prefix_cache_queries", "prefix_cache_hits",
                                                           "prefill_tokens", "kv_blocks_total", "block_size")
                      if hasattr(s, name)})
    return facts


class Trace:
    """Drives engine.step() and records each step's start/end, the sequences running during it
    (running after the step plus those it finished) and every token's time (the step's end)."""

    def __init__(self, engine):
        self.engine = engine
        self.steps: list[tuple[float, float, int, int]] = []  # (start, end, running, waiting at start)
        self.token_times: dict[object, list[float]] = {}
        self.token_step: dict[object, list[int]] = {}

    def step(self) -> list:
        waiting = len(self.engine.waiting)
        start = time.monotonic()
        produced = self.engine.step()
        end = time.monotonic()
        finished = {id(seq) for seq, _ in produced if seq.finished}
        self.steps.append((start, end, len(self.engine.running) + len(finished), waiting))
        for seq, _ in produced:
            self.token_times.setdefault(seq, []).append(end)
            self.token_step.setdefault(seq, []).append(len(self.steps) - 1)
        return produced

    def drain(self) -> None:
        idle = 0
        while self.engine.has_work():
            idle = 0 if self.step() else idle + 1
            if idle > 1000:
                raise SystemExit("the engine has work but produced no token in 1000 steps")


def check_lengths(seqs) -> None:
    for seq in seqs:
        if seq.finish_reason != "length" or len(seq.output) != seq.params.max_tokens:
            raise SystemExit(f"request {getattr(seq, 'id', '?')}: finish_reason {seq.finish_reason!r} after "
                             f"{len(seq.output)} of {seq.params.max_tokens} tokens: unequal work, no figure")


def output_digest(seqs) -> str:
    import hashlib

    return hashlib.sha256(json.dumps([seq.output for seq in seqs]).encode()).hexdigest()[:16]


def request_latencies(seqs) -> dict:
    ttft = [s.first_token_at - s.arrived for s in seqs]
    tpot = [(s.finished_at - s.first_token_at) / (len(s.output) - 1) for s in seqs if len(s.output) > 1]
    return {"ttft_p50_ms": 1e3 * percentile(ttft, 50), "ttft_p95_ms": 1e3 * percentile(ttft, 95),
            "tpot_p50_ms": 1e3 * percentile(tpot, 50), "tpot_p95_ms": 1e3 * percentile(tpot, 95)}


def fig_backlog(side: Side, mix: str, count: int, seed: int) -> dict:
    """Figure 1: all `count` requests queued at once, drained."""
    context, slots = 256, BUDGET_SEQUENCES[1]
    engine, kwargs = side.engine(context, slots)
    seqs = [engine.add(p, side.params(m, seed + i)) for i, (p, m) in enumerate(requests(seed, count, mix, 8192))]
    trace = Trace(engine)
    started, cpu_started = time.monotonic(), time.process_time()
    trace.drain()
    wall, cpu = time.monotonic() - started, time.process_time() - cpu_started
    check_lengths(seqs)
    backlog = [(end - start, running) for start, end, running, waiting in trace.steps if waiting]
    backlog_time = sum(d for d, _ in backlog)
    tokens = sum(len(s.output) for s in seqs)
    return {"mix": mix, "requests": count, "engine_kwargs": kwargs, "old_slots": slots,
            "budget_bytes": side.budget_bytes(context, slots),
            "mean_running_backlog": sum(d * r for d, r in backlog) / backlog_time if backlog_time else None,
            "mean_running_all": sum((e - s) * r for s, e, r, _ in trace.steps) / sum(e - s for s, e, *_ in trace.steps),
            "peak_running": max(r for _, _, r, _ in trace.steps), "steps": len(trace.steps),
            "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall, "cpu_s": cpu,
            "digest": output_digest(seqs), **request_latencies(seqs), **engine_facts(engine)}


def fig_closed_loop(side: Side, concurrency: int, count: int, seed: int) -> dict:
    """Figure 2: `concurrency` requests in flight until `count` have been submitted."""
    context = 256
    engine, kwargs = side.engine(context, concurrency)
    plan = requests(seed, count, "typical", 8192)
    seqs = []

    def submit():
        prompt, max_tokens = plan[len(seqs)]
        seqs.append(engine.add(prompt, side.params(max_tokens, seed + len(seqs))))

    trace = Trace(engine)
    started, cpu_started = time.monotonic(), time.process_time()
    for _ in range(min(concurrency, count)):
        submit()
    while engine.has_work():
        for seq, _ in trace.step():
            if seq.finished and len(seqs) < count:
                submit()
    wall, cpu = time.monotonic() - started, time.process_time() - cpu_started
    check_lengths(seqs)
    tokens = sum(len(s.output) for s in seqs)
    return {"concurrency": concurrency, "requests": count, "engine_kwargs": kwargs, "old_slots": concurrency,
            "budget_bytes": side.budget_bytes(context, concurrency), "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "cpu_s": cpu, "steps": len(trace.steps),
            "mean_running": sum((e - s) * r for s, e, r, _ in trace.steps) / sum(e - s for s, e, *_ in trace.steps),
            "digest": output_digest(seqs), **request_latencies(seqs), **engine_facts(engine)}


def _long_prompt_run(side: Side, with_long: bool, inject_after: int, decode_tokens: int, seed: int,
                     max_batched_tokens: int | None):
    context, slots = 4096, BUDGET_SEQUENCES[3]
    engine, kwargs = side.engine(context, slots, max_batched_tokens=max_batched_tokens)
    plan = requests(seed, DECODERS, "typical", 8192)
    decoders = [engine.add(p, side.params(decode_tokens, seed + i)) for i, (p, _) in enumerate(plan)]
    trace = Trace(engine)
    while not all(s.output for s in decoders):  # every decoder past its prefill
        trace.step()
    for _ in range(inject_after):
        trace.step()
    first_window_step = len(trace.steps)
    long_seq = None
    if with_long:
        import random

        rng = random.Random(seed + 1)
        long_seq = engine.add([rng.randrange(1, 8192) for _ in range(LONG_PROMPT)], side.params(16, seed + 99))
        while not long_seq.output:
            trace.step()
    trace.drain()
    check_lengths(decoders + ([long_seq] if long_seq else []))
    return trace, decoders, long_seq, first_window_step, kwargs, engine


def _window(trace: Trace, decoders, first: int, last: int) -> dict:
    """The decoders' inter-token gaps of tokens produced in steps first..last, and per decoder
    the mean gap over those steps (its TPOT in the window)."""
    gaps, tpots = [], []
    for seq in decoders:
        times, steps = trace.token_times[seq], trace.token_step[seq]
        inside = [i for i, s in enumerate(steps) if first <= s <= last and i > 0]
        seq_gaps = [times[i] - times[i - 1] for i in inside]
        gaps += seq_gaps
        if seq_gaps:
            tpots.append(sum(seq_gaps) / len(seq_gaps))
    starved = len(decoders) - len(tpots)  # decoders without a token in the window
    return {"gap_p50_ms": 1e3 * percentile(gaps, 50), "gap_p95_ms": 1e3 * percentile(gaps, 95),
            "gap_max_ms": 1e3 * max(gaps) if gaps else None,
            "tpot_p95_ms": 1e3 * percentile(tpots, 95) if tpots else None,
            "decoders_without_token": starved, "window_steps": last - first + 1}


def fig_long_prompt(side: Side, max_batched_tokens: int | None, seed: int, inject_after: int = 8) -> dict:
    """Figure 3: with and without one 2k-token prompt among 16 decoders. The decoders generate
    enough tokens to outlast the long prompt's chunked prefill at the smallest budget (what 32
    tokens a step leave after their 16) and its own 16 tokens, the same number on every row."""
    decode_tokens = inject_after + LONG_PROMPT // (32 - DECODERS) + 40
    with_trace, with_dec, long_seq, first, kwargs, engine = _long_prompt_run(
        side, True, inject_after, decode_tokens, seed, max_batched_tokens)
    last = with_trace.token_step[long_seq][0]
    control_trace, control_dec, _, control_first, _, _ = _long_prompt_run(
        side, False, inject_after, decode_tokens, seed, max_batched_tokens)
    during, control = _window(with_trace, with_dec, first, last), _window(control_trace, control_dec, first, last)
    after = with_trace.token_step[long_seq][-1]  # the long prompt decodes its tokens among them
    after_window = _window(with_trace, with_dec, last + 1, after)
    control_after = _window(control_trace, control_dec, last + 1, after)
    whole_with, whole_control = request_latencies(with_dec), request_latencies(control_dec)
    return {"max_batched_tokens": max_batched_tokens, "engine_kwargs": kwargs, "old_slots": BUDGET_SEQUENCES[3],
            "budget_bytes": side.budget_bytes(4096, BUDGET_SEQUENCES[3]), "decode_tokens": decode_tokens,
            "long_ttft_ms": 1e3 * (long_seq.first_token_at - long_seq.arrived),
            "long_queue_ms": 1e3 * (long_seq.scheduled_at - long_seq.arrived) if long_seq.scheduled_at else None,
            "window": during, "control_window": control, "aligned": first == control_first,
            "after_window": after_window, "control_after_window": control_after,
            "tpot_p95_whole_ms": whole_with["tpot_p95_ms"], "control_tpot_p95_whole_ms": whole_control["tpot_p95_ms"],
            "digest": output_digest(with_dec), "control_digest": output_digest(control_dec), **engine_facts(engine)}


def fig_prefix(side: Side, prefix_caching: bool | None, count: int, seed: int) -> dict:
    """Figure 4: `count` prompts sharing a 512-token prefix, one at a time; the first fills the cache."""
    import random

    context, slots = 1024, BUDGET_SEQUENCES[4]
    engine, kwargs = side.engine(context, slots, prefix_caching=prefix_caching)
    rng = random.Random(seed)
    prefix = [rng.randrange(1, 8192) for _ in range(PREFIX)]
    seqs = []
    for i in range(count):
        seq = engine.add(prefix + [rng.randrange(1, 8192) for _ in range(SUFFIX)], side.params(2, seed + i))
        while engine.has_work():
            engine.step()
        seqs.append(seq)
    check_lengths(seqs)
    ttft = [1e3 * (s.first_token_at - s.arrived) for s in seqs[1:]]
    return {"prefix_caching": prefix_caching, "engine_kwargs": kwargs, "requests": count, "old_slots": slots,
            "budget_bytes": side.budget_bytes(context, slots),
            "first_ttft_ms": 1e3 * (seqs[0].first_token_at - seqs[0].arrived), "ttft_mean_ms": statistics.mean(ttft),
            "ttft_p50_ms": percentile(ttft, 50), "ttft_p95_ms": percentile(ttft, 95),
            "digest": output_digest(seqs), **engine_facts(engine)}


def worker(spec: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    side = Side()
    fig_backlog(side, "typical", 16, seed=12345)  # warm-up: allocator, kernels, the 256 model
    results = []
    for job in spec["jobs"]:
        kind, kwargs = job["figure"], {k: v for k, v in job.items() if k != "figure"}
        if not side.paged and any(done["figure"] == kind for done in results) and kind in ("long_prompt", "prefix"):
            continue  # the slot engine has no max_batched_tokens or prefix cache: one row each
        results.append({"figure": kind, **{"backlog": fig_backlog, "closed_loop": fig_closed_loop,
                                           "long_prompt": fig_long_prompt, "prefix": fig_prefix}[kind](side, **kwargs)})
    return {"paged": side.paged, "engine_file": side.engine_file, "torch": torch.__version__,
            "threads": torch.get_num_threads(), "results": results}


# ------------------------------------------------------------------------------------------------
# driver


def run_side(name: str, sources: list[str], jobs: list[dict]) -> dict:
    env = {**os.environ, **sources_env(sources), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, __file__, "--worker", json.dumps({"jobs": jobs})], env=env,
                          capture_output=True, text=True, timeout=WORKER_TIMEOUT)
    if done.returncode:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"the {name} side failed (exit {done.returncode})")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"  {name}: {len(result['results'])} rows in {time.monotonic() - started:.1f} s ({result['engine_file']})",
          file=sys.stderr)
    return result


def plan(figures: set[int], scale: float) -> dict[int, list[dict]]:
    n = lambda count: max(4, int(count * scale))  # noqa: E731
    jobs = {}
    if 1 in figures:
        jobs[1] = [{"figure": "backlog", "mix": mix, "count": n(128), "seed": 1} for mix in MIXES]
    if 2 in figures:
        jobs[2] = [{"figure": "closed_loop", "concurrency": c, "count": n(4 * c), "seed": 2} for c in (16, 64)]
    if 3 in figures:
        jobs[3] = [{"figure": "long_prompt", "max_batched_tokens": mbt, "seed": 3} for mbt in (32, 48, 64, 128, 512)]
    if 4 in figures:
        jobs[4] = [{"figure": "prefix", "prefix_caching": pc, "count": n(25), "seed": 4} for pc in (False, True)]
    return jobs


def median_rounds(rounds: list[dict]) -> dict:
    """Per job, the round with the median tokens/s (or TTFT): keeps each row's numbers consistent
    (the other rounds' values of that key are kept in `rounds`)."""
    if len(rounds) == 1:
        return rounds[0]
    merged = dict(rounds[0], results=[])
    for i in range(len(rounds[0]["results"])):
        rows = [r["results"][i] for r in rounds]
        key = next(k for k in ("tokens_per_s", "long_ttft_ms", "ttft_mean_ms") if k in rows[0])
        rows.sort(key=lambda row: row[key])
        merged["results"].append({**rows[len(rows) // 2], "rounds": [row[key] for row in rows]})
    return merged


def ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def fmt(value, digits=0, suffix="") -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}{suffix}"


def row(label: str, old: str = "", new: str = "", versus: str = "", goal: str = "") -> str:
    return f"| {label} | {old} | {new} | {versus} | {goal} |"


def throughput(side: dict) -> str:
    """Generated tokens per wall second, and per CPU second of the worker (less sensitive to
    other processes taking the CPU away on a shared machine)."""
    return f"{fmt(side['tokens_per_s'])} ({fmt(side['tokens'] / side['cpu_s'])})"


def backlog_rows(old: dict, new: dict) -> list[str]:
    (pl, ph), (ol, oh) = MIXES[old["mix"]]
    tag = f"1. {old['mix']} mix (prompts {pl}..{ph}, outputs {ol}..{oh}), {old['requests']} queued"
    mean_old, mean_new = old["mean_running_backlog"], new["mean_running_backlog"]
    rows = [row(f"{tag}: running sequences, mean while the backlog waits", fmt(mean_old, 1), fmt(mean_new, 1),
                f"**{fmt(ratio(mean_new, mean_old), 2, 'x')}**", ">= 4x" if old["mix"] == "typical" else ""),
            row(f"{tag}: running sequences, peak", old["peak_running"], new["peak_running"],
                fmt(ratio(new["peak_running"], old["peak_running"]), 2, "x")),
            row(f"{tag}: tokens/s (per CPU second)", throughput(old), throughput(new),
                fmt(ratio(new["tokens_per_s"], old["tokens_per_s"]), 2, "x"))]
    if "preemptions" in new:
        rows.append(row(f"{tag}: preemptions", "", new["preemptions"]))
    return rows


def closed_loop_rows(old: dict, new: dict) -> list[str]:
    c = old["concurrency"]
    latency = "{:.1f} / {:.1f}".format
    return [row(f"2. tokens/s (per CPU second), {c} in flight ({old['requests']} requests; old: {c} slots)",
                throughput(old), throughput(new),
                f"**{fmt(ratio(new['tokens_per_s'], old['tokens_per_s']), 2, 'x')}**"),
            row(f"2. {c} in flight: TTFT p95 / TPOT p95 (ms)", latency(old["ttft_p95_ms"], old["tpot_p95_ms"]),
                latency(new["ttft_p95_ms"], new["tpot_p95_ms"]))]


def long_prompt_rows(old: dict, new: dict, paged: bool) -> list[str]:
    tag = f"3. 2k prompt among 16 decoders (new: max_batched_tokens {new['max_batched_tokens'] if paged else 'n/a'})"

    def spike(side: dict, key: str, window: str = "window") -> str:
        during, without = side[window][key], side[f"control_{window}"][key]
        return f"{fmt(during, 1)} / {fmt(without, 1)} (**{fmt(ratio(during, without), 1, 'x')}**)"

    def whole(side: dict) -> str:
        during, without = side["tpot_p95_whole_ms"], side["control_tpot_p95_whole_ms"]
        return (f"{side['window']['window_steps']}; {fmt(during, 1)} / {fmt(without, 1)} "
                f"({fmt(ratio(during, without), 1, 'x')})")

    return [row(f"{tag}: long prompt TTFT", fmt(old["long_ttft_ms"], 0, " ms"), fmt(new["long_ttft_ms"], 0, " ms"),
                fmt(ratio(new["long_ttft_ms"], old["long_ttft_ms"]), 2, "x")),
            row(f"{tag}: decoders' TPOT p95 in the window / without the prompt (ms)", spike(old, "tpot_p95_ms"),
                spike(new, "tpot_p95_ms"), "", "new <= 2x"),
            row(f"{tag}: decoders' gap p95 in the window / without (ms); longest gap",
                f"{spike(old, 'gap_p95_ms')}; {fmt(old['window']['gap_max_ms'], 1, ' ms')}",
                f"{spike(new, 'gap_p95_ms')}; {fmt(new['window']['gap_max_ms'], 1, ' ms')}"),
            row(f"{tag}: decoders' gap p95 while the long prompt then decodes / without (ms)",
                spike(old, "gap_p95_ms", "after_window"), spike(new, "gap_p95_ms", "after_window")),
            row(f"{tag}: window steps; decoders' whole-life TPOT p95 with / without (ms)", whole(old), whole(new))]


def prefix_rows(old: dict, new_rows: list[dict], paged: bool) -> list[str]:
    by_flag = {r["prefix_caching"]: r for r in new_rows}
    cached = by_flag[True]["ttft_mean_ms"] if paged and True in by_flag else None
    uncached = by_flag[False]["ttft_mean_ms"] if False in by_flag else None
    tag = f"4. TTFT mean, 512-token shared prefix + 32 distinct, {old['requests'] - 1} after the first"
    return [row(f"{tag}: old / new with prefix caching", fmt(old["ttft_mean_ms"], 1, " ms"), fmt(cached, 1, " ms"),
                f"**{fmt(ratio(old['ttft_mean_ms'], cached), 2, 'x lower')}**", ">= 3x lower"),
            row(f"{tag}: new without / with prefix caching", "", f"{fmt(uncached, 1)} / {fmt(cached, 1, ' ms')}",
                f"**{fmt(ratio(uncached, cached), 2, 'x lower')}**", ">= 3x lower")]


def tables(results: dict[int, dict[str, dict]]) -> list[str]:
    lines = [row("figure", "today's engine (old)", "paged engine (new)", "new vs old", "goal"), "|---|---|---|---|---|"]
    pairs = {f: (results[f]["old"]["results"], results[f]["new"]["results"], results[f]["new"]["paged"])
             for f in results}
    if 1 in pairs:
        for old, new in zip(pairs[1][0], pairs[1][1], strict=True):
            lines += backlog_rows(old, new)
    if 2 in pairs:
        for old, new in zip(pairs[2][0], pairs[2][1], strict=True):
            lines += closed_loop_rows(old, new)
    if 3 in pairs:
        for new in pairs[3][1]:  # the slot engine ignores max_batched_tokens: one old row
            lines += long_prompt_rows(pairs[3][0][0], new, pairs[3][2])
    if 4 in pairs:
        lines += prefix_rows(pairs[4][0][0], pairs[4][1], pairs[4][2])
    return lines


def same_outputs(results: dict[int, dict[str, dict]]) -> dict[str, list[bool]]:
    """Per figure and row: did both engines generate the same greedy tokens for the same requests
    (random weights: near-ties can flip under a different summation order, so a difference is
    reported, not fatal)."""
    same = {}
    for figure, sides in results.items():
        old, new = sides["old"]["results"], sides["new"]["results"]
        same[str(figure)] = [row["digest"] == old[min(i, len(old) - 1)]["digest"] for i, row in enumerate(new)]
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-rev", default=BASELINE_REV,
                        help="git revision of today's engine (default %(default)s)")
    parser.add_argument("--figures", default="1,2,3,4", help="comma-separated subset of 1,2,3,4")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per figure, order alternating (ABBA); median")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the request counts (0.25: a smoke run)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        isolate_sources()
        print(json.dumps(worker(json.loads(args.worker))))
        return
    try:
        figures = {int(f) for f in args.figures.split(",")}
    except ValueError:
        raise SystemExit(f"--figures {args.figures!r}: expected numbers from 1,2,3,4") from None
    if not figures <= {1, 2, 3, 4} or args.rounds < 1:
        raise SystemExit("--figures takes numbers from 1,2,3,4; --rounds at least 1")
    baseline_rev = resolve_rev(args.baseline_rev)
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "services/"],
                                capture_output=True, text=True).stdout.strip())
    started = time.monotonic()
    results: dict[int, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="engine-bench-baseline-") as tmp:
        sides = {"old": extract_baseline(baseline_rev, Path(tmp)), "new": source_dirs(REPO)}
        for figure, jobs in plan(figures, args.scale).items():
            print(f"figure {figure}:", file=sys.stderr)
            rounds = {"old": [], "new": []}
            for r in range(args.rounds):
                for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
                    rounds[name].append(run_side(name, sides[name], jobs))
            results[figure] = {name: median_rounds(rs) for name, rs in rounds.items()}
    lines = tables(results)
    print("\n".join(lines))
    same = same_outputs(results)
    print(f"greedy outputs equal, old vs new, per row: {same}", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"baseline_rev": baseline_rev, "new_rev": head, "new_tree_dirty": dirty, "rounds": args.rounds,
              "scale": args.scale, "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "wall_s": time.monotonic() - started,
              "table": lines, "outputs_equal": same, "figures": {str(k): v for k, v in results.items()}}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n{args.out} ({report['wall_s']:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
