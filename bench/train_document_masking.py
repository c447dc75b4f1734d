#!/usr/bin/env python3
"""`make bench-gpu`: what document masking costs or saves in training, at a long context.

Tokens/s of a forward + backward (no optimizer step) of the Llama-style llama-350m (MobileLLM's
shape: 32 layers, 15 query and 5 key/value heads of 64, bf16 weights and activations, RoPE tables in
fp32) on one sequence of 32,768 tokens, side by side in one process on the same tokens:
  causal    GPT.forward(idx): causal SDPA (flash attention), what training runs without documents;
  document  GPT.forward(idx, documents=…): lmforge.model.document_mask, flex attention with a
            document-causal BlockMask (compiled once; the first steps pay for the compilation).
The documents are packed as data-prep packs them: lengths drawn from a log-normal with mean about
2,048 tokens (σ = 1, seeded), each ending with the end-of-text token, the last one cut at the
sequence's end. Flex skips the blocks of keys no query of a block may see, so attention's work
falls to about `attention_pairs_fraction` of the causal one's (the sum of the documents' own causal
pairs over the sequence's); the MLP, projections and head cost the same in both rows. The steps
alternate between the two rows after warm-up; figures are medians over the measured steps.
The model is eager (no torch.compile): only the attention kernels differ.

--smoke: tiny shapes (2 layers of llama-debug, 256 tokens, documents of about 48), fp32, on CPU, in
seconds: a check of the code path, not a figure (the document row then runs SDPA with a dense mask,
flex having no CPU backward).

Results: bench/out/document-masking.json (document-masking-smoke.json with --smoke), with the date,
the command line, the device and torch version.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def document_lengths(seq_len: int, mean: float, sigma: float, seed: int) -> list[int]:
    """Log-normal lengths (mean `mean`) of documents packed into one sequence, the last cut to fit."""
    import numpy as np

    rng = np.random.default_rng(seed)
    mu = math.log(mean) - sigma**2 / 2  # the log-normal's mean is exp(mu + σ²/2)
    lengths: list[int] = []
    while sum(lengths) < seq_len:
        lengths.append(max(2, int(rng.lognormal(mu, sigma))))
    lengths[-1] -= sum(lengths) - seq_len
    return [length for length in lengths if length > 0]


def packed_batch(batch: int, seq_len: int, vocab_size: int, mean: float, seed: int):
    """(token ids (B, T + 1), documents of the inputs (B, T), the documents' lengths): random tokens, each
    document ending with the end-of-text token (vocab_size − 1)."""
    import torch

    from lmforge.model.document_mask import document_ids

    eot = vocab_size - 1
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(eot, (batch, seq_len + 1), generator=generator)
    lengths = []
    for row in range(batch):
        row_lengths = document_lengths(seq_len + 1, mean, sigma=1.0, seed=seed + row)
        ends = torch.tensor(row_lengths).cumsum(0) - 1
        tokens[row, ends] = eot
        lengths.append(row_lengths)
    return tokens, document_ids(tokens[:, :-1], eot), lengths


def attention_pairs_fraction(lengths: list[list[int]], seq_len: int) -> float:
    """The query-key pairs document masking attends, over the causal mask's."""
    pairs = sum(length * (length + 1) // 2 for row in lengths for length in row)
    return pairs / (len(lengths) * seq_len * (seq_len + 1) // 2)


def build_model(args, device):
    import torch

    from lmforge.model.config import GPTConfig
    from lmforge.model.transformer import GPT

    overrides = {"context_length": args.seq_len, "dropout": 0.0, **({"n_layer": 2} if args.smoke else {})}
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset(args.preset, **overrides)).to(device)
    for param in model.parameters():  # weights (and so activations) in the benchmark's dtype; RoPE tables stay fp32
        param.data = param.data.to(getattr(torch, args.dtype))
    return model


def step_seconds(model, tokens, documents, device) -> tuple[float, float]:
    """(seconds, loss) of one forward + backward (with the document row's BlockMask built)."""
    import torch

    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    synchronize()
    start = time.perf_counter()
    # A new documents tensor each step, as in training: the BlockMask is built again (inside the timing).
    documents = None if documents is None else documents.clone()
    _, loss = model(tokens[:, :-1], tokens[:, 1:], documents=documents)
    loss.backward()
    synchronize()
    elapsed = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return elapsed, loss.item()


def run(args) -> dict:
    import torch

    device = torch.device(args.device)
    model = build_model(args, device)
    tokens, documents, lengths = packed_batch(args.batch, args.seq_len, model.config.vocab_size,
                                              args.mean_document_tokens, args.seed)
    tokens, documents = tokens.to(device), documents.to(device)
    rows = {"causal": None, "document": documents}
    times: dict[str, list[float]] = {name: [] for name in rows}
    losses: dict[str, float] = {}
    peak: dict[str, int | None] = {}
    for name, docs in rows.items():  # warm-up: kernels, flex's compilation, the allocator
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for _ in range(args.warmup):
            step_seconds(model, tokens, docs, device)
        peak[name] = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    for step in range(args.steps):
        for name in (("causal", "document") if step % 2 == 0 else ("document", "causal")):
            seconds, losses[name] = step_seconds(model, tokens, rows[name], device)
            times[name].append(seconds)
    tokens_per_step = args.batch * args.seq_len
    document_lengths_flat = [length for row in lengths for length in row]
    result_rows = []
    for name in rows:
        median = statistics.median(times[name])
        row = {"attention": name, "seq_len": args.seq_len, "batch": args.batch,
               "backend": "sdpa (is_causal)" if name == "causal" else ("flex" if device.type == "cuda" else "sdpa"),
               "step_seconds": median, "step_seconds_all": times[name], "tokens_per_second": tokens_per_step / median,
               "loss": losses[name], "peak_memory_bytes": peak[name]}
        if name == "document":
            row |= {"documents_per_sequence": len(document_lengths_flat) / args.batch,
                    "mean_document_tokens": statistics.mean(document_lengths_flat),
                    "attention_pairs_fraction": attention_pairs_fraction(lengths, args.seq_len)}
        result_rows.append(row)
    by = {row["attention"]: row for row in result_rows}
    return {"bench": "document-masking", "smoke": args.smoke, "device": device.type,
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
            "torch": torch.__version__, "preset": args.preset, "dtype": args.dtype, "seq_len": args.seq_len,
            "batch": args.batch, "steps_measured": args.steps, "warmup_steps": args.warmup,
            "date": datetime.now(UTC).isoformat(timespec="seconds"), "command": sys.argv,
            "rows": result_rows,
            "document_over_causal": by["document"]["tokens_per_second"] / by["causal"]["tokens_per_second"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default=None, help="default cuda (cpu with --smoke)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU in seconds: the code path, no figure")
    parser.add_argument("--preset", default=None, help="default llama-350m (llama-debug with --smoke)")
    parser.add_argument("--seq-len", type=int, default=None, help="default 32768 (256 with --smoke)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--mean-document-tokens", type=float, default=None, help="default 2048 (48 with --smoke)")
    parser.add_argument("--dtype", default=None, help="default bfloat16 (float32 with --smoke)")
    parser.add_argument("--steps", type=int, default=None, help="measured steps per row, default 10 (3 with --smoke)")
    parser.add_argument("--warmup", type=int, default=None, help="default 3 (1 with --smoke)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(REPO / "bench" / "out"))
    args = parser.parse_args()
    defaults = ({"device": "cpu", "preset": "llama-debug", "seq_len": 256, "mean_document_tokens": 48,
                 "dtype": "float32", "steps": 3, "warmup": 1} if args.smoke else
                {"device": "cuda", "preset": "llama-350m", "seq_len": 32768, "mean_document_tokens": 2048,
                 "dtype": "bfloat16", "steps": 10, "warmup": 3})
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    result = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"document-masking{'-smoke' if args.smoke else ''}.json"
    path.write_text(json.dumps(result, indent=1))
    for row in result["rows"]:
        print(f"{row['attention']:>9}  {row['backend']:<16} {row['tokens_per_second']:>12,.0f} tokens/s  "
              f"{row['step_seconds'] * 1000:>9.1f} ms/step")
    print(f"document / causal tokens/s: {result['document_over_causal']:.2f}  -> {path}")


if __name__ == "__main__":
    main()
