#!/usr/bin/env python3
"""`make bench-gpu`'s serving table: lmforge-serve (serve_bench.py --suite gpu) beside
transformers' `generate` with a static cache (hf_generate_bench.py), per preset (350m and llama-1b)
and client count: tokens/s of each, their ratio, TTFT / TPOT p50 and p95 of each, and how busy the
GPU was under lmforge-serve. Goal, per preset: lmforge >= 3x at 64 clients.

Rows pair by (preset, clients): a preset only one run measured (cut short by a time limit) is
left out. Checks that the two runs are comparable: the same GPU (or CPU), max_tokens and request
count, and the same generated tokens (every request ran to max_tokens in both).

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


def presets_of(report: dict) -> list[str]:
    """The presets a run covered (a run from before several presets names one, `preset`)."""
    settings = report.get("settings", {})
    return list(settings.get("presets") or [settings.get("preset")])


def keyed(report: dict) -> dict[tuple, dict]:
    """{(preset, clients): table row}; a row without `preset` is the run's one preset's."""
    default = presets_of(report)[0]
    return {(t.get("preset", default), t["clients"]): t for t in report["table"]}


def compare(serve: dict, hf: dict) -> dict:
    ours, theirs = keyed(serve), keyed(hf)
    rows = []
    for key in sorted(set(ours) & set(theirs), key=lambda k: (presets_of(serve).index(k[0]), k[1])):
        a, b = ours[key], theirs[key]
        rows.append({
            "preset": key[0], "clients": key[1],
            "lmforge_tokens_per_s": a["tokens_per_s"], "hf_tokens_per_s": b["tokens_per_s"],
            "ratio": a["tokens_per_s"] / b["tokens_per_s"] if a["tokens_per_s"] and b["tokens_per_s"] else None,
            **{f"{who}_{k}": row[k] for who, row in (("lmforge", a), ("hf", b))
               for k in ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s")},
            "lmforge_gpu_busy_mean_pct": a.get("gpu_busy_mean_pct"),
            "same_tokens": set(a["generated_tokens_per_round"]) == set(b["generated_tokens_per_round"]),
        })
    s, h = serve.get("settings", {}), hf.get("settings", {})
    checks = {
        "same_device": serve["machine"].get("gpu") == hf["machine"].get("gpu") and s.get("device") == h.get("device"),
        "same_max_tokens": s.get("max_tokens") == h.get("max_tokens"),
        "same_generated_tokens": bool(rows) and all(r["same_tokens"] for r in rows),
        "serve_checks_ok": serve["checks"].get("ok", False),
        "hf_checks_ok": all(hf["checks"].values()) if hf["checks"] else False,
    }
    goals = {}
    for preset in dict.fromkeys(r["preset"] for r in rows):
        ratio = next((r["ratio"] for r in rows if (r["preset"], r["clients"]) == (preset, GOAL_CLIENTS)), None)
        goals[preset] = {"clients": GOAL_CLIENTS, "ratio_at_least": GOAL_RATIO, "ratio": ratio,
                         "met": ratio is not None and ratio >= GOAL_RATIO}
    return {"table": rows, "checks": checks, "goals": goals,
            "device": serve["machine"].get("gpu") or s.get("device"), "presets": list(goals),
            "max_tokens": s.get("max_tokens"), "hf_engine": hf.get("engine"),
            "hf_compile": h.get("compile"), "serve_date": serve.get("date"), "hf_date": hf.get("date")}


def markdown(result: dict) -> str:
    lines = [f"{', '.join(result['presets'])} on {result['device']}, {result['max_tokens']} tokens per request; "
             f"lmforge-serve vs {result['hf_engine']} (compile {result['hf_compile']})", "",
             "| preset | clients | lmforge tokens/s | HF generate tokens/s | ratio | lmforge TTFT p50 / p95 ms | "
             "HF TTFT p50 / p95 ms | lmforge TPOT p50 / p95 ms | HF TPOT p50 / p95 ms | GPU busy (lmforge) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["table"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        busy = r.get("lmforge_gpu_busy_mean_pct")
        lines.append(f"| {r['preset']} | {r['clients']} | {r['lmforge_tokens_per_s']:.0f} | "
                     f"{r['hf_tokens_per_s']:.0f} | {ratio} | "
                     f"{ms(r['lmforge_ttft_p50_s'])} / {ms(r['lmforge_ttft_p95_s'])} | "
                     f"{ms(r['hf_ttft_p50_s'])} / {ms(r['hf_ttft_p95_s'])} | "
                     f"{ms(r['lmforge_tpot_p50_s'])} / {ms(r['lmforge_tpot_p95_s'])} | "
                     f"{ms(r['hf_tpot_p50_s'])} / {ms(r['hf_tpot_p95_s'])} | "
                     f"{'-' if busy is None else f'{busy:.0f}%'} |")
    lines.append("")
    for preset, goal in result["goals"].items():
        got = "not measured" if goal["ratio"] is None else \
            f"{goal['ratio']:.2f}x ({'met' if goal['met'] else 'NOT met'})"
        lines.append(f"goal, {preset}: lmforge >= {goal['ratio_at_least']:.0f}x HF's tokens/s at {goal['clients']} "
                     f"clients: {got}")
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
        raise SystemExit(f"{args.serve} and {args.hf} share no (preset, client count)")
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
