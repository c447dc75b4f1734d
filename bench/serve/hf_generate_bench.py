#!/usr/bin/env python3
"""The baseline of `make bench-gpu`'s serving figures: Hugging Face transformers' `generate`
with a static KV cache, on the same model, prompts and GPU as `serve_bench.py --suite gpu`.

The model is serve_bench's package (the same preset, tokenizer and weights, with the
end-of-text row pushed away so that every request runs to max_tokens; reused from
bench/out/serve when serve_bench built it, built the same way otherwise), exported with
lmforge's own exporter (lmforge.model.hf_package.write_hf_package, the code behind
`lmforge-train export --format hf`) and loaded with `AutoModelForCausalLM.from_pretrained` in
bf16 (fp32 on CPU) with transformers' default attention (SDPA).

At each concurrency C the requests serve_bench sends (the same count, max(16, 4C) unless
--requests, and the same prompt for request i: loadgen's seeded plan) go to the model C at a
time, as one left-padded batch per `model.generate(..., max_new_tokens, do_sample=False,
cache_implementation="static")` call: a static batch, the way C closed-loop clients are
served by a server without continuous batching (all C finish together, then send their next
requests). Greedy, where serve_bench's clients sample at temperature 1 (the sampling is the
bigger of the two workloads, so this does not favour lmforge). With a static cache on CUDA,
transformers compiles the decoding step by itself (torch.compile, "reduce-overhead"); a
warm-up `generate` per C, with the mix's longest prompt, sizes the cache (transformers keeps
the largest length asked for, so later calls reuse it) and triggers that compilation outside
the timing. `--compile off` sets `disable_compile` (eager decoding) instead.

Timing (time.perf_counter on the host): a streamer records when each step's tokens reach the
host (transformers copies them with `.cpu()`, a device synchronisation, before `put`):
  TTFT  = `generate` called -> the first generated token on the host (prefill + first sample;
          every request of a batch has its batch's value)
  TPOT  = (last token - first token) / (max_new_tokens - 1)
  tokens/s = generated tokens / wall time from the first batch's start to the last's end.
Each row must hold exactly max_new_tokens tokens and no end-of-text (checked), so the token
counts equal lmforge's.

    python bench/serve/hf_generate_bench.py                      # 350m, then llama-1b, on cuda, 1/16/64 clients
    python bench/serve/hf_generate_bench.py --device cpu --preset tiny --clients 1 4 --requests 4 --max-tokens 8

Presets: serve_bench's GPU suite's (350m and llama-1b), one model at a time; `--preset` picks others.
Results: bench/out/hf-generate-gpu.json (rewritten after every row; rows keyed by preset) and a Markdown table;
bench/serve/serve_vs_hf.py puts them beside serve_bench's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from transformers.generation.streamers import BaseStreamer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import LoadConfig, percentile  # noqa: E402
from serve_bench import EOT, PROMPTS, REPO, SUITES, build_package, machine, ms, prompt_mix, sample_texts  # noqa: E402

SUITE = SUITES["gpu"]


class StepClock(BaseStreamer):
    """A `generate` streamer that only timestamps: `put` is called with the prompt first, then
    with each step's tokens (batch-wide)."""

    def __init__(self) -> None:
        self.prompt_seen = False
        self.steps: list[float] = []

    def put(self, value) -> None:
        if self.prompt_seen:
            self.steps.append(time.perf_counter())
        self.prompt_seen = True

    def end(self) -> None:
        pass


def package_for(work: Path, preset: str, context_length: int, seed: int, rebuild: bool) -> tuple[Path, list[str]]:
    """serve_bench's package (reused when it is there) and the texts its prompts come from."""
    from lmforge.model.package import verify_package

    package = work / f"model-{preset}-ctx{context_length}"
    if not rebuild and (package / "config.json").is_file():
        try:
            verify_package(package)
        except Exception as exc:  # noqa: BLE001 - anything wrong with it: build it again
            print(f"{package}: {exc}; building it again", flush=True)
        else:
            return package, sample_texts(work, 3000, 11)
    return build_package(work, preset, context_length, seed)


def export_hf(package: Path, out: Path) -> Path:
    from lmforge.model.hf_package import write_hf_package
    from lmforge.model.package import load_package

    model, meta = load_package(package, "cpu")
    return write_hf_package(model, package / "tokenizer.json", out, step=meta.get("step") or 0)


def left_pad(rows: list[list[int]], length: int, pad_id: int):
    import torch

    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, length - len(row):] = torch.tensor(row, dtype=torch.long)
        mask[i, length - len(row):] = 1
    return ids, mask


def run_batch(model, rows: list[list[int]], length: int, max_tokens: int, eos_id: int, device: str,
              compile_mode: str) -> dict:
    """One `generate` of a left-padded batch: timings and the per-row checks."""
    import torch

    ids, mask = left_pad(rows, length, eos_id)
    clock = StepClock()
    started = time.perf_counter()
    output = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_tokens,
                            do_sample=False, cache_implementation="static",
                            pad_token_id=eos_id, eos_token_id=eos_id, streamer=clock,
                            disable_compile=compile_mode == "off")
    ended = time.perf_counter()
    generated = output[:, length:].cpu()
    rows_ok = generated.shape[1] == max_tokens and not bool((generated == eos_id).any())
    steps = clock.steps
    ttft = steps[0] - started if steps else None
    tpot = (steps[-1] - steps[0]) / (len(steps) - 1) if len(steps) > 1 else None
    del output
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return {"rows": len(rows), "padded_length": length, "prompt_tokens": [len(r) for r in rows],
            "generated_tokens": int(generated.shape[0] * generated.shape[1]), "steps": len(steps),
            "all_ran_to_max_tokens": rows_ok and len(steps) == max_tokens,
            "started": started, "ended": ended, "wall_s": ended - started, "ttft_s": ttft, "tpot_s": tpot}


def measure(model, prompt_ids: list[list[int]], clients: int, requests: int, max_tokens: int, eos_id: int,
            device: str, compile_mode: str, seed: int) -> dict:
    """`requests` requests, `clients` at a time, in loadgen's order (request i: the same prompt)."""
    plan = LoadConfig(url="", prompts=[""] * len(prompt_ids), seed=seed)
    order = [plan.request_plan(i)[0] for i in range(requests)]
    batches = []
    for start in range(0, requests, clients):
        rows = [prompt_ids[p] for p in order[start:start + clients]]
        batches.append(run_batch(model, rows, max(len(r) for r in rows), max_tokens, eos_id, device, compile_mode))
    wall = batches[-1]["ended"] - batches[0]["started"]
    tokens = sum(b["generated_tokens"] for b in batches)
    ttft = [b["ttft_s"] for b in batches for _ in range(b["rows"]) if b["ttft_s"] is not None]
    tpot = [b["tpot_s"] for b in batches for _ in range(b["rows"]) if b["tpot_s"] is not None]
    return {"clients": clients, "requests": requests, "generated_tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall if wall > 0 else None,
            "ttft_p50_s": percentile(ttft, 50), "ttft_p95_s": percentile(ttft, 95),
            "tpot_p50_s": percentile(tpot, 50), "tpot_p95_s": percentile(tpot, 95),
            "all_ran_to_max_tokens": all(b["all_ran_to_max_tokens"] for b in batches),
            "prompt_order": order, "batches": batches}


def compiled_graphs() -> int:
    """Graphs torch.compile has built in this process so far (recompilations included)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0
    return int(counters["stats"].get("unique_graphs", 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", nargs="+", default=SUITE["presets"],
                        help="model preset(s), one after the other, space- or comma-separated (default: "
                             "%(default)s)")
    parser.add_argument("--device", default=SUITE["device"])
    parser.add_argument("--dtype", choices=["bfloat16", "float32"],
                        help="weights and compute (default: bfloat16 on cuda, float32 on cpu)")
    parser.add_argument("--clients", type=int, nargs="+", default=SUITE["clients"],
                        help="concurrency C: requests go C at a time, one generate per batch")
    parser.add_argument("--requests", type=int, help="requests per concurrency (default: serve_bench's, "
                                                     "max(16, 4C))")
    parser.add_argument("--max-tokens", type=int, default=SUITE["max_tokens"])
    parser.add_argument("--rounds", type=int, default=SUITE["rounds"])
    parser.add_argument("--compile", choices=["auto", "off"], default="auto",
                        help="auto: transformers' own choice (it compiles the decoding step with a static cache "
                             "on CUDA); off: disable_compile")
    parser.add_argument("--rebuild", action="store_true", help="build the model package even if serve_bench's is there")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="result JSON (default bench/out/hf-generate-gpu.json)")
    args = parser.parse_args()
    import torch
    import transformers

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here (use --device cpu --preset tiny for a check)")
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    out = Path(args.out or REPO / "bench" / "out" / "hf-generate-gpu.json")
    work = REPO / "bench" / "out" / "serve"
    work.mkdir(parents=True, exist_ok=True)

    presets = [p for value in args.preset for p in value.split(",") if p]
    started = time.perf_counter()
    report = {"engine": f"transformers {transformers.__version__} generate, static cache",
              "settings": {"presets": presets, "device": args.device, "dtype": dtype, "clients": args.clients,
                           "requests": args.requests, "max_tokens": args.max_tokens, "rounds": args.rounds,
                           "compile": args.compile, "do_sample": False, "cache_implementation": "static"},
              "models": {}, "machine": machine(), "date": time.strftime("%Y-%m-%d"), "prompt_tokens": {},
              "table": [], "rounds": [], "checks": {}}
    for preset in presets:
        run_preset(preset, args, dtype, work, report, out, started)
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()  # the previous preset's model is gone: its memory back for the next
    out.with_suffix(".md").write_text(markdown(report) + "\n")
    print()
    print(markdown(report))
    print(f"\nresults: {out}")
    if not report["checks"]["all_ran_to_max_tokens"]:
        raise SystemExit("check failed: a row did not generate exactly max_tokens tokens (end-of-text reached?)")


def run_preset(preset: str, args: argparse.Namespace, dtype: str, work: Path, report: dict, out: Path,
               started: float) -> None:
    """One preset: serve_bench's package exported to the HF format, loaded, and every client count's
    rounds (report rows appended; the JSON rewritten after each)."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    loaded = time.perf_counter()
    package, texts = package_for(work, preset, SUITE["context_length"], args.seed, args.rebuild)
    prompts, prompt_sizes = prompt_mix(texts, package / "tokenizer.json", PROMPTS, SUITE["prompt_tokens"], args.seed)
    hf_dir = export_hf(package, work / f"hf-{preset}-ctx{SUITE['context_length']}")
    tokenizer = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    eos_id = tokenizer.token_to_id(EOT)
    prompt_ids = [e.ids for e in tokenizer.encode_batch(prompts, add_special_tokens=False)]  # as lmforge-serve does
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=getattr(torch, dtype)).to(args.device).eval()
    print(f"{package} exported to {hf_dir} and loaded as {type(model).__name__} ({dtype}, {args.device}, "
          f"attention {model.config._attn_implementation}) in {time.perf_counter() - loaded:.1f} s; "
          f"{len(prompts)} prompts of {min(prompt_sizes)}-{max(prompt_sizes)} tokens", flush=True)
    report["models"][preset] = {"attention": model.config._attn_implementation, "model_class": type(model).__name__}
    report["prompt_tokens"][preset] = prompt_sizes
    longest = max(len(ids) for ids in prompt_ids)
    with torch.inference_mode():
        for clients in args.clients:
            requests = args.requests or max(16, 4 * clients)
            graphs = compiled_graphs()
            warm = time.perf_counter()  # warm-up: the cache at its largest length, compilation; not measured
            batch = [prompt_ids[i % len(prompt_ids)] for i in range(clients)]
            run_batch(model, batch, longest, args.max_tokens, eos_id, args.device, args.compile)
            warmup = {"seconds": time.perf_counter() - warm, "compiled_graphs": compiled_graphs() - graphs}
            rows = []
            for round_index in range(args.rounds):
                graphs = compiled_graphs()
                result = measure(model, prompt_ids, clients, requests, args.max_tokens, eos_id, args.device,
                                 args.compile, args.seed)
                result.update(preset=preset, round=round_index + 1, compiled_graphs=compiled_graphs() - graphs)
                rows.append(result)
                print(f"{preset} round {round_index + 1}: {clients} clients, {requests} requests, "
                      f"{result['generated_tokens']} tokens in {result['wall_s']:.2f} s: "
                      f"{result['tokens_per_s']:.1f} tokens/s; TTFT p50 "
                      f"{ms(result['ttft_p50_s'])} ms p95 {ms(result['ttft_p95_s'])} ms; TPOT p50 "
                      f"{ms(result['tpot_p50_s'])} ms p95 {ms(result['tpot_p95_s'])} ms; all ran to max_tokens: "
                      f"{result['all_ran_to_max_tokens']}; warm-up {warmup['seconds']:.1f} s "
                      f"({warmup['compiled_graphs']} graphs compiled), {result['compiled_graphs']} while measured",
                      flush=True)
            report["rounds"].extend(rows)
            report["table"].append(summarize(preset, clients, rows, warmup))
            report["checks"] = {"all_ran_to_max_tokens": all(r["all_ran_to_max_tokens"] for r in report["rounds"])}
            report["seconds"] = time.perf_counter() - started
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=1))  # after every row: a timeout keeps what was measured


def summarize(preset: str, clients: int, rows: list[dict], warmup: dict) -> dict:
    """Per concurrency: tokens/s as the median of the rounds; percentiles over all rounds' requests."""
    def pooled(key: str) -> list[float]:
        return [b[key] for r in rows for b in r["batches"] for _ in range(b["rows"]) if b[key] is not None]

    rates = [r["tokens_per_s"] for r in rows]
    return {"preset": preset, "clients": clients, "rounds": len(rows), "tokens_per_s": percentile(rates, 50),
            "tokens_per_s_rounds": rates, "generated_tokens_per_round": [r["generated_tokens"] for r in rows],
            "ttft_p50_s": percentile(pooled("ttft_s"), 50), "ttft_p95_s": percentile(pooled("ttft_s"), 95),
            "tpot_p50_s": percentile(pooled("tpot_s"), 50), "tpot_p95_s": percentile(pooled("tpot_s"), 95),
            "warmup_s": warmup["seconds"], "compiled_graphs": warmup["compiled_graphs"]
            + sum(r["compiled_graphs"] for r in rows)}


def markdown(report: dict) -> str:
    s = report["settings"]
    models = ", ".join(f"{m['model_class']} {preset}" for preset, m in report["models"].items())
    lines = [f"{report['engine']}, {models} ({s['dtype']}, {s['device']}, compile "
             f"{s['compile']}), {s['max_tokens']} new tokens per request, greedy",
             "", "| preset | clients | tokens/s (median of rounds) | rounds | TTFT p50 ms | TTFT p95 ms | "
             "TPOT p50 ms | TPOT p95 ms | warm-up s | graphs compiled |", "|---|---|---|---|---|---|---|---|---|---|"]
    for t in report["table"]:
        rounds = ", ".join(f"{r:.0f}" for r in t["tokens_per_s_rounds"])
        lines.append(f"| {t['preset']} | {t['clients']} | {t['tokens_per_s']:.0f} | {rounds} | {ms(t['ttft_p50_s'])} | "
                     f"{ms(t['ttft_p95_s'])} | {ms(t['tpot_p50_s'])} | {ms(t['tpot_p95_s'])} | {t['warmup_s']:.1f} | "
                     f"{t['compiled_graphs']} |")
    lines.append(f"checks: {report['checks']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
