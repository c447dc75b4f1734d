"""A schedule's plan (schedule_plan) as a JSON-ready document, as a text table, and as the chart's values.

Each stage's figures are a single plan's (render.plan_document over the stage's request, whose tokens
are the stage's steps × its global batch), so a stage reads like `plan` for its sequence length and
batch; the totals add the stages up.

The chart values are one deployment's: the first stage's layout as `parallel:` (render.chart_values),
and the whole run's `schedule:` (each stage with its start, global batch, sequence length, the
micro-batch its own layout uses as batch_size, and what the file gave of mixture, RoPE and document
masking, and the `mesh` its layout has), `steps` the run's. A run resumes exactly on another layout,
so a later stage whose layout differs is a redeployment at its first step: the trainer stops before a
stage planned for another mesh (exit 8, the step before it checkpointed), and the header says with
which `parallel:` and world size to resume. Without grad_accum (a schedule derives the micro-batches
from its global_batch_tokens, and refuses one). Each stage's batch splits on its own layout (its
micro-batch is that layout's), so a deployment runs all of its stages.
"""

from __future__ import annotations

from typing import Any

import yaml

from lmforge.trainer.layout_rules import MESH_AXES
from lmforge.trainer.planner.render import _describe, _gib, plan_document
from lmforge.trainer.planner.schedule_plan import SchedulePlan
from lmforge.trainer.schedule import Stage

PASSED_THROUGH = ("mixture", "rope_theta", "rope_scaling", "document_masking")  # from the file, as written


def schedule_document(plan: SchedulePlan) -> dict[str, Any]:
    """Everything, in plain numbers (bytes, seconds, tokens, US dollars)."""
    stages, plans = [], []
    for stage_plan in plan.stages:
        single = plan_document(stage_plan.request, stage_plan.candidates, stage_plan.evaluated, plan.model, top=0)
        plans.append(single)
        stage, best = stage_plan.stage, single["recommended"]
        entry: dict[str, Any] = {
            "index": stage.index,
            "name": stage.name,
            "first_step": stage.first_step,
            "steps": stage_plan.steps,
            "start_tokens": stage.tokens_before,
            "end_tokens": stage.tokens_before + stage_plan.tokens,
            "tokens": stage_plan.tokens,
            "seq_len": stage.seq_len,
            "global_batch_sequences": stage.sequences,
            "global_batch_tokens": stage.global_batch_tokens,
            "evaluated_layouts": single["evaluated_layouts"],
            "fitting_count": single["fitting_count"],
            "recommended": best,
        }
        if best is None:
            entry["smallest_memory"] = single["smallest_memory"]
        else:
            entry["tokens_per_second"] = stage.global_batch_tokens / best["step"]["step_seconds"]
        stages.append(entry)
    first = plans[0]
    document: dict[str, Any] = {
        **{key: first[key] for key in ("model", "cluster", "state", "assumptions")},
        "schedule": {"tokens": plan.tokens, "steps": plan.steps, "data_seq_len": plan.data_seq_len},
        "stages": stages,
        "total": _total(stages) if plan.fits else None,
        "chart_values": None,
        "deployments": None,
    }
    if plan.fits:
        document["chart_values"], document["deployments"] = _values_and_deployments(plan, plans)
    return document


def _total(stages: list[dict[str, Any]]) -> dict[str, Any]:
    runs = [stage["recommended"]["run"] for stage in stages]
    cost = [run["cost_usd"] for run in runs]
    return {
        "steps": sum(run["steps"] for run in runs),
        "tokens": sum(stage["tokens"] for stage in stages),
        "wall_clock_days": sum(run["wall_clock_days"] for run in runs),
        "wall_clock_days_range": [sum(run["wall_clock_days_range"][i] for run in runs) for i in (0, 1)],
        "gpu_hours": sum(run["gpu_hours"] for run in runs),
        "cost_usd": None if None in cost else sum(cost),
    }


def _values_and_deployments(plan: SchedulePlan, plans: list[dict[str, Any]]):
    """The first stage's chart values with the run's schedule, and each deployment: the stage it starts
    at, its parallel section and world size, and what the trainer's start check says of the schedule."""
    entries = [_stage_entry(sp.stage, written, sp.best.layout.micro_batch,
                            _mesh(single["chart_values"]["training"]["config"]["parallel"]))
               for sp, written, single in zip(plan.stages, plan.written, plans, strict=True)]
    values = plans[0]["chart_values"]
    config = values["training"]["config"]
    config.pop("grad_accum", None)
    config["data"] = {"seq_len": plan.data_seq_len, "batch_size": entries[0]["batch_size"]}
    config["schedule"] = entries
    config["steps"] = plan.steps
    deployments: list[dict[str, Any]] = []
    for sp, single in zip(plan.stages, plans, strict=True):
        training = single["chart_values"]["training"]
        parallel = training["config"]["parallel"]
        if deployments and deployments[-1]["parallel"] == parallel:
            continue
        deployments.append({
            "stage": sp.stage.index,
            "name": sp.stage.name,
            "first_step": sp.stage.first_step,
            "start_tokens": sp.stage.tokens_before,
            "nodes": training["nodes"],
            "nproc_per_node": training["nprocPerNode"],
            "world_size": training["nodes"] * training["nprocPerNode"],
            "parallel": parallel,
        })
    return values, deployments


def _mesh(parallel: dict[str, Any]) -> dict[str, int]:
    return {axis: int(parallel.get(axis, 1)) for axis in MESH_AXES}


def _stage_entry(stage: Stage, written: dict[str, Any], micro_batch: int, mesh: dict[str, int]) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": stage.name,
        "start_tokens": written.get("start_tokens", 0),
        "global_batch_tokens": stage.global_batch_tokens,
        "seq_len": stage.seq_len,
        "batch_size": micro_batch,
    }
    entry.update({key: written[key] for key in PASSED_THROUGH if written.get(key) is not None})
    entry["mesh"] = mesh
    return entry


def _tokens(count: float) -> str:
    """Tokens for reading: 1.2T, 300B, 4.19M (exact counts are in the JSON)."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if count >= scale:
            return f"{count / scale:.4g}{unit}"
    return f"{count:.0f}"


def _layout_line(parallel: dict[str, Any]) -> str:
    return " ".join(f"{key}={str(value).lower() if isinstance(value, bool) else value}"
                    for key, value in parallel.items())


def schedule_values_yaml(document: dict[str, Any]) -> str:
    """The chart values, with a header: the run's figures, and each redeployment at a stage boundary."""
    if document["chart_values"] is None:
        return "# lmforge-train plan --schedule: a stage has no layout that fits, so there are no values to render\n"
    cluster, model, total = document["cluster"], document["model"], document["total"]
    header = [
        f"# lmforge-train plan --schedule: {model['preset']} on {cluster['nodes']} × {cluster['gpus_per_node']} "
        f"{cluster['gpu']} ({cluster['precision']}), {len(document['stages'])} stages",
        f"# {_tokens(total['tokens'])} tokens in {total['steps']} steps, {total['wall_clock_days']:.1f} days "
        f"({total['wall_clock_days_range'][0]:.1f}–{total['wall_clock_days_range'][1]:.1f})",
    ]
    for deployment in document["deployments"][1:]:
        header.append(
            f"# at stage {deployment['name']!r} (step {deployment['first_step']}, "
            f"{_tokens(deployment['start_tokens'])} tokens) redeploy on {deployment['nodes']} × "
            f"{deployment['nproc_per_node']} GPUs (world size "
            f"{deployment['world_size']}) with parallel: {_layout_line(deployment['parallel'])} (the run on the "
            "previous layout stops before it, exit 8)"
        )
    if cluster["precision"] == "fp8":
        header.append("# precision fp8: train with Float8 linears (the trainer's float8 option)")
    if cluster["nodes"] > 1:
        header.append("# more than one node: add training.checkpoints.persistentVolumeClaim (a ReadWriteMany claim)")
    return "\n".join(header) + "\n" + yaml.safe_dump(document["chart_values"], sort_keys=False)


def schedule_table(document: dict[str, Any]) -> str:
    """One block per stage, then the totals."""
    model, cluster, schedule = document["model"], document["cluster"], document["schedule"]
    lines = [
        f"model      {model['preset']}: {model['params'] / 1e9:.2f}B parameters, {model['layers']} layers, "
        f"d={model['dim']}; bf16 weights {model['weights_bf16_bytes'] / 1e9:.0f} GB",
        f"cluster    {cluster['nodes']} × {cluster['gpus_per_node']} {cluster['gpu']} = {cluster['gpus']} GPUs, "
        f"{cluster['precision']}, {_gib(cluster['usable_memory_bytes_per_gpu']):.1f} GiB usable per GPU",
        f"schedule   {len(document['stages'])} stages, {_tokens(schedule['tokens'])} tokens in "
        f"{schedule['steps']} steps",
    ]
    redeploy_at = {d["stage"]: d for d in document["deployments"] or []}
    for stage in document["stages"]:
        lines += ["", *_stage_block(stage, cluster, redeploy_at.get(stage["index"]))]
    total = document["total"]
    lines.append("")
    if total is None:
        lines.append("total      none: a stage has no layout that fits in GPU memory")
    else:
        lines.append(
            f"total      {total['steps']} steps, {_tokens(total['tokens'])} tokens, "
            f"{total['wall_clock_days']:.1f} days "
            f"(range {total['wall_clock_days_range'][0]:.1f}–{total['wall_clock_days_range'][1]:.1f}), "
            f"{total['gpu_hours']:.3g} GPU-hours"
            + (f", ${total['cost_usd']:,.0f} at ${cluster['usd_per_gpu_hour']}/GPU-hour"
               if total["cost_usd"] is not None else "")
        )
        lines.append("           (--format values: the chart values for the run; --format json: every figure)")
    return "\n".join(lines) + "\n"


def _stage_block(stage: dict[str, Any], cluster: dict[str, Any], deployment: dict[str, Any] | None) -> list[str]:
    head = (
        f"stage {stage['index']} {stage['name']}: tokens {_tokens(stage['start_tokens'])} → "
        f"{_tokens(stage['end_tokens'])} ({_tokens(stage['tokens'])}), steps {stage['first_step']}–"
        f"{stage['first_step'] + stage['steps'] - 1}; "
        f"sequences of {stage['seq_len']}, global batch {stage['global_batch_sequences']} sequences "
        f"({stage['global_batch_tokens'] / 2**20:.2f}Mi tokens)"
    )
    best = stage["recommended"]
    if best is None:
        smallest = stage["smallest_memory"]
        return [head, f"  NO LAYOUT FITS: the smallest needs {_gib(smallest['memory_bytes']['total']):.1f} GiB per GPU "
                      f"({_describe(smallest['layout'])})"]
    step, run = best["step"], best["run"]
    lines = [
        head,
        f"  layout   {_describe(best['layout'])}",
        f"  memory   {_gib(best['memory_bytes']['total']):.1f} GiB per GPU (activations "
        f"{_gib(best['memory_bytes']['activations']):.1f})",
        f"  step     {step['step_seconds']:.2f} s (range {step['step_seconds_range'][0]:.2f}–"
        f"{step['step_seconds_range'][1]:.2f}), MFU {step['mfu']:.1%}, {stage['tokens_per_second']:,.0f} tokens/s",
        f"  run      {run['steps']} steps, {run['wall_clock_days']:.1f} days (range "
        f"{run['wall_clock_days_range'][0]:.1f}–{run['wall_clock_days_range'][1]:.1f}), {run['gpu_hours']:.3g} "
        "GPU-hours" + (f", ${run['cost_usd']:,.0f}" if run["cost_usd"] is not None else ""),
    ]
    if deployment is not None and deployment["stage"] > 0:
        lines.append(f"  redeploy at step {deployment['first_step']}: world size {deployment['world_size']}, "
                     f"parallel: {_layout_line(deployment['parallel'])}")
    return lines
