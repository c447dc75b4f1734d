#!/usr/bin/env python3
"""`make bench-gpu`'s serving table: lmforge-serve (serve_bench.py --suite gpu) beside
transformers' `generate` with a static cache (hf_generate_bench.py), per client count:
tokens/s of each, their ratio, and TTFT / TPOT p50 and p95 of each. Goal: lmforge >= 3x at 64
clients.

Checks that the two runs are comparable: the same GPU (or CPU), preset, max_tokens and
request count, and the same generated tokens (every request ran to max_tokens in both).

    python bench/serve/serve_vs_hf.py [--serve bench/out/serve-gpu.json] [--hf bench/out/hf-generate-gpu.json]

Writes --out (default bench/out/serve-vs-hf-gpu.json) and the table beside it (.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GOAL_CLIENTS, GOAL_RATIO = 64, 3.0


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def load(path: Path, what: str) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SystemExit(f"{path}: no {what} results (run it first)") from None
    except json.JSONDecodeError as exc:
        raise SystemExit(f"{path}: not JSON ({exc})") from None


def compare(serve: dict, hf: dict) -> dict:
    ours = {t["clients"]: t for t in serve["table"]}
    theirs = {t["clients"]: t for t in hf["table"]}
    rows = []
    for clients in sorted(set(ours) & set(theirs)):
        a, b = ours[clients], theirs[clients]
        rows.append({
            "clients": clients,
            "lmforge_tokens_per_s": a["tokens_per_s"], "hf_tokens_per_s": b["tokens_per_s"],
            "ratio": a["tokens_per_s"] / b["tokens_per_s"] if a["tokens_per_s"] and b["tokens_per_s"] else None,
            **{f"{who}_{key}": row[key] for who, row in (("lmforge", a), ("hf", b))
               for key in ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s")},
            "same_tokens": set(a["generated_tokens_per_round"]) == set(b["generated_tokens_per_round"]),
        })
    s, h = serve.get("settings", {}), hf.get("settings", {})
    checks = {
        "same_device": serve["machine"].get("gpu") == hf["machine"].get("gpu") and s.get("device") == h.get("device"),
        "same_preset": s.get("preset") == h.get("preset"),
        "same_max_tokens": s.get("max_tokens") == h.get("max_tokens"),
        "same_generated_tokens": bool(rows) and all(r["same_tokens"] for r in rows),
        "serve_checks_ok": serve["checks"].get("ok", False),
        "hf_checks_ok": all(hf["checks"].values()) if hf["checks"] else False,
    }
    goal = next((r["ratio"] for r in rows if r["clients"] == GOAL_CLIENTS), None)
    return {"table": rows, "checks": checks, "goal": {"clients": GOAL_CLIENTS, "ratio_at_least": GOAL_RATIO,
                                                       "ratio": goal, "met": goal is not None and goal >= GOAL_RATIO},
            "device": serve["machine"].get("gpu") or s.get("device"), "preset": s.get("preset"),
            "max_tokens": s.get("max_tokens"), "hf_engine": hf.get("engine"),
            "hf_compile": h.get("compile"), "serve_date": serve.get("date"), "hf_date": hf.get("date")}


def markdown(result: dict) -> str:
    lines = [f"{result['preset']} on {result['device']}, {result['max_tokens']} tokens per request; "
             f"lmforge-serve vs {result['hf_engine']} (compile {result['hf_compile']})", "",
             "| clients | lmforge tokens/s | HF generate tokens/s | ratio | lmforge TTFT p50 / p95 ms | "
             "HF TTFT p50 / p95 ms | lmforge TPOT p50 / p95 ms | HF TPOT p50 / p95 ms |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["table"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        lines.append(f"| {r['clients']} | {r['lmforge_tokens_per_s']:.0f} | {r['hf_tokens_per_s']:.0f} | {ratio} | "
                     f"{ms(r['lmforge_ttft_p50_s'])} / {ms(r['lmforge_ttft_p95_s'])} | "
                     f"{ms(r['hf_ttft_p50_s'])} / {ms(r['hf_ttft_p95_s'])} | "
                     f"{ms(r['lmforge_tpot_p50_s'])} / {ms(r['lmforge_tpot_p95_s'])} | "
                     f"{ms(r['hf_tpot_p50_s'])} / {ms(r['hf_tpot_p95_s'])} |")
    goal = result["goal"]
    got = "not measured" if goal["ratio"] is None else f"{goal['ratio']:.2f}x ({'met' if goal['met'] else 'NOT met'})"
    lines.append(f"\ngoal: lmforge >= {goal['ratio_at_least']:.0f}x HF's tokens/s at {goal['clients']} clients: {got}")
    lines.append(f"checks: {result['checks']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", default=str(REPO / "bench" / "out" / "serve-gpu.json"))
    parser.add_argument("--hf", default=str(REPO / "bench" / "out" / "hf-generate-gpu.json"))
    parser.add_argument("--out", default=str(REPO / "bench" / "out" / "serve-vs-hf-gpu.json"))
    args = parser.parse_args()
    result = compare(load(Path(args.serve), "serve_bench"), load(Path(args.hf), "hf_generate_bench"))
    if not result["table"]:
        raise SystemExit(f"{args.serve} and {args.hf} share no client count")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    table = markdown(result)
    out.with_suffix(".md").write_text(table + "\n")
    print(table)
    print(f"\nresults: {out}")
    if not all(result["checks"].values()):
        print(f"warning: the two runs are not comparable: {result['checks']}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
