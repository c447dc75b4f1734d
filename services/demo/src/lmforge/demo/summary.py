"""The demo's closing summary: a JSON document (WORKDIR/summary.json) and its text form."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from lmforge.common.atomic_files import atomic_write_bytes
from lmforge.demo.stages.trace import trace_lines


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    atomic_write_bytes(path, (json.dumps(summary, indent=1) + "\n").encode())


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def _evaluation_lines(evaluation: dict[str, Any] | None) -> list[str]:
    if not evaluation or not evaluation["packages"]:
        return []
    from lmforge.demo.stages.evaluation import evaluation_line

    alert = (f"; {evaluation['alert']} fired in Prometheus" if evaluation.get("alert")
             else " (the regression alert did not fire)" if evaluation["zeroed_step"] is not None else "")
    return [f"Evaluation  {evaluation_line(evaluation)}{alert}",
            "            scores per checkpoint over tokens: the training report's \"Checkpoint evaluations\""]


def render(summary: dict[str, Any]) -> str:
    data, train, serve, canary, dash, look = (summary[k] for k in ("data", "train", "serve", "canary",
                                                                   "dashboards", "where"))
    funnel = " → ".join(f"{stage} {out:,}" for stage, _, out in data["funnel"])
    kept = data["kept_docs"] / max(data["documents"], 1)
    checkpoints = "\n".join(f"{' ' * 12}{uri}" for uri in train["checkpoint_uris"])
    curl = shlex.join(["curl", "-s", f"{serve['url']}/v1/completions", "-H",
                       f"Authorization: Bearer {serve['api_key']}", "-H", "Content-Type: application/json",
                       "-d", json.dumps({"prompt": serve["completions"][0]["prompt"], "max_tokens": 32})])
    val = f"{train['final_val_loss']:.3f}" if train["final_val_loss"] is not None else "n/a"
    lines = [
        f"lmforge demo finished in {summary['seconds'] / 60:.1f} min",
        f"Data        {data['wet_files']} WET files, {_mb(data['text_bytes'])} of text, {data['documents']:,} documents"
        f" → {data['kept_docs']:,} kept ({kept:.0%}), {data['tokens']:,} tokens in {data['shards']} shards",
        f"            funnel (documents out): {funnel}",
        f"Training    {train['preset']} preset, {train['nproc']} processes ({train['mode']}), {train['steps']} steps:"
        f" train loss {train['final_loss']:.3f}, val loss {val}, {train['tokens_per_second']:,.0f} tokens/s",
        f"            attempt 1 killed by {train['killed_by']} at step {train['interrupted_at']}, restored step "
        f"{train['restored_step']} from S3; "
        f"steps {train['compared_steps'][0]}–{train['compared_steps'][-1]} recomputed with identical losses "
        f"(max difference {train['max_loss_difference']})",
        f"            checkpoints in S3 ({train['s3_endpoint']}):",
        checkpoints,
        *_evaluation_lines(train.get("evaluation")),
        f"Serving     {serve['url']} ({serve['model']}): TTFT {serve['ttft_ms']:.0f} ms, TPOT {serve['tpot_ms']:.1f} ms"
        " (means over every request so far)",
        *[f"            {'(streamed) ' if c['streamed'] else ''}{c['prompt']!r} → {c['text'][:70]!r}"
          for c in serve["completions"]],
        *trace_lines(serve.get("trace")),
        f"Canary      {'pass' if canary['passed'] else 'REGRESSION'}: perplexity {canary['perplexity']:.2f}, "
        f"score {canary['score']:.2f} (baseline recorded: {canary['baseline']})",
        f"Dashboards  {len(dash['with_data'])} panel queries return data"
        + (f", {len(dash['empty'])} EMPTY: {'; '.join(dash['empty'])}" if dash["empty"] else "")
        + (f" ({len(dash['gpu_only'])} GPU-only panels not asked: no GPU)" if dash["gpu_only"] else ""),
        f"Look at     data report   {look['report']}",
        f"            training      {look['training_report']}  (loss, lr, grad norm, tokens/s, MFU; checkpoints "
        "and the resume marked)",
        f"            metrics       {look['metrics']}",
        f"            dashboards    {look['dashboards']}  (each panel drawn from Prometheus)",
        f"            Prometheus    {look['prometheus']}  (alerts: {look['prometheus']}/alerts)",
        f"            Pushgateway   {look['pushgateway']}",
        f"            logs          {look['logs']}",
        f"            summary       {look['summary']}",
        f"Try         {curl}",
    ]
    return "\n".join(lines) + "\n"
