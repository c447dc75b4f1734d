"""A plan as a JSON-ready document, as a text table, and as the chart's training values.

The chart values are `training:` of helm/lmforge/values.yaml: nodes × nprocPerNode GPUs
(gpusPerProcess 1) and the trainer config under `config:`, whose `parallel:` block carries the
layout in the trainer's mesh axes {dp_replicate, dp_shard, tp, pp, cp, ep} (their product, ep
aside, is the world size; lmforge.trainer.mesh_layout), activation checkpointing, and under PP the
micro-batch count. It names the data-parallel `mode` the axes call for too: the chart's default
`mode: ddp` would otherwise be merged in beside them. `data.batch_size` is
the micro-batch (sequences per data-parallel rank); the micro-batches per step are
`grad_accum` without PP and `parallel.pp_microbatches` with it, so that in both cases the global
batch is dp_replicate · dp_shard · batch_size · micro-batches.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import yaml

from lmforge.trainer.mesh_layout import wrapper_mode
from lmforge.trainer.planner.costs import run_totals, training_flops
from lmforge.trainer.planner.efficiency import calibrated
from lmforge.trainer.planner.search import Candidate, PlanRequest
from lmforge.trainer.planner.timing import FP8_OVER_BF16, model_flops_per_step

PP_MICROBATCHES_KEY = "pp_microbatches"


def candidate_document(candidate: Candidate) -> dict[str, Any]:
    layout, time = candidate.layout, candidate.time
    return {
        "layout": asdict(layout),
        "fits": candidate.fits,
        "memory_bytes": candidate.memory.as_dict(),
        "communication": {
            axis: {
                "collective": c.collective,
                "bytes": c.bytes,
                "seconds": c.seconds,
                "link": "nvlink" if c.inside_node else "network",
                "overlapped": c.overlapped,
            }
            for axis, c in candidate.comm.items()
        },
        "pipeline_bubble": layout.pipeline_bubble,
        "step": {
            **asdict(time),
            "step_seconds_range": list(time.step_seconds_range),
            "mfu_range": list(time.mfu_range),
        },
    }


def plan_document(
    request: PlanRequest,
    candidates: list[Candidate],
    evaluated: int,
    model: dict[str, Any],
    top: int,
    include_all: bool = False,
) -> dict[str, Any]:
    """Everything the planner decided, in plain numbers (bytes, seconds, FLOPs, US dollars)."""
    shape, cluster = request.shape, request.cluster
    tokens_per_step = request.global_batch * request.seq_len
    fitting = [c for c in candidates if c.fits]
    best = fitting[0] if fitting else None
    state = request.state
    document: dict[str, Any] = {
        "model": {
            **model,
            "params": shape.params,
            "active_params": shape.active_params,
            "layers": shape.layers,
            "dim": shape.dim,
            "heads": shape.heads,
            "kv_heads": shape.kv_heads,
            "ffn_hidden": shape.ffn_hidden,
            "vocab": shape.vocab,
            "experts": shape.experts,
            "top_k": shape.top_k,
            "weights_bf16_bytes": 2 * shape.params,
        },
        "workload": {
            "tokens": request.tokens,
            "seq_len": request.seq_len,
            "global_batch_sequences": request.global_batch,
            "global_batch_tokens": tokens_per_step,
        },
        "cluster": {
            "gpu": cluster.gpu.name,
            "gpu_source": cluster.gpu.source,
            "nodes": cluster.nodes,
            "gpus_per_node": cluster.gpus_per_node,
            "gpus": cluster.gpus,
            "precision": request.precision,
            "peak_flops_per_gpu": request.peak_flops,
            "memory_bytes_per_gpu": cluster.gpu.memory_bytes,
            "usable_memory_bytes_per_gpu": request.usable_memory,
            "nvlink_bytes_per_s": cluster.nvlink_bytes_per_s,
            "network_bytes_per_s": cluster.network_bytes_per_s,
            "comm_efficiency": cluster.comm_efficiency,
            "usd_per_gpu_hour": cluster.usd_per_gpu_hour,
        },
        "state": {
            "param_dtype": state.param_dtype,
            "grad_dtype": state.grad_dtype or state.param_dtype,
            "moment_dtype": state.moment_dtype,
            "reduce_dtype": state.reduce_dtype,
            "bytes_per_param": {
                "params": state.param_bytes,
                "grads": state.grad_bytes,
                "optimizer": state.optimizer_bytes,
            },
        },
        "assumptions": {
            "compute_efficiency": compute_efficiency(request) if request.fixed_mfu is None else None,
            "fixed_mfu": request.fixed_mfu,
            "flash_attention": request.flash_attention,
            "memory_headroom": request.memory_headroom,
            "activation_checkpointing": request.activation_checkpointing,
            "flops_convention": "6N+attention" if request.attention_flops else "6N",
        },
        "flops": {
            "six_n_d": training_flops(shape.six_n_flops_per_token() / 6, request.tokens),
            "with_attention": request.tokens * shape.flops_per_token(request.seq_len),
            "per_step": model_flops_per_step(shape, request.seq_len, request.global_batch, request.attention_flops),
        },
        "evaluated_layouts": evaluated,
        "candidate_count": len(candidates),
        "fitting_count": len(fitting),
        "recommended": None,
        "chart_values": None,
        "candidates": [candidate_document(c) for c in (candidates if include_all else candidates[:top])],
    }
    if best is not None:
        run = run_totals(
            request.tokens, tokens_per_step, best.time.step_seconds, cluster.gpus, cluster.usd_per_gpu_hour
        )
        fast, slow = (
            run_totals(request.tokens, tokens_per_step, seconds, cluster.gpus, cluster.usd_per_gpu_hour)
            for seconds in best.time.step_seconds_range
        )
        run["wall_clock_days_range"] = [fast["wall_clock_days"], slow["wall_clock_days"]]
        run["gpu_hours_range"] = [fast["gpu_hours"], slow["gpu_hours"]]
        document["recommended"] = {**candidate_document(best), "run": run}
        document["chart_values"] = chart_values(request, best, model, run["steps"])
    else:
        smallest = min(candidates, key=lambda c: c.memory.total)
        document["smallest_memory"] = candidate_document(smallest)
    return document


def compute_efficiency(request: PlanRequest) -> dict[str, Any]:
    """The calibrated kernel-efficiency model and what it gives for this model's matmul width."""
    efficiency, width = calibrated(), request.shape.matmul_width
    return {
        **efficiency.as_dict(),
        "matmul_width": width,
        "at_this_model": efficiency.at(width),
        "float8_speedup": efficiency.float8_speedup(width, FP8_OVER_BF16) if request.precision == "fp8" else None,
        "calibration": "lmforge/trainer/planner/calibration.json",
    }


def chart_values(request: PlanRequest, candidate: Candidate, model: dict[str, Any], steps: int) -> dict[str, Any]:
    """The recommendation as helm/lmforge values (`training:`)."""
    layout = candidate.layout
    axes = layout.axes()
    parallel: dict[str, Any] = {
        "mode": wrapper_mode(axes),
        **axes,
        "activation_checkpointing": layout.activation_checkpointing,
    }
    config: dict[str, Any] = {
        "model": {"preset": model["preset"], **({"overrides": model["overrides"]} if model.get("overrides") else {})},
        "data": {"seq_len": request.seq_len, "batch_size": layout.micro_batch},
        "parallel": parallel,
        "steps": steps,
    }
    if layout.pp > 1:
        parallel[PP_MICROBATCHES_KEY] = layout.microbatches
    elif layout.microbatches > 1:
        config["grad_accum"] = layout.microbatches
    if request.precision == "fp8":  # the planner's fp8 is Float8 linears, tensorwise scaling
        config["float8"] = {"enabled": True, "recipe": "tensorwise"}
    return {
        "training": {
            "enabled": True,
            "nodes": request.cluster.nodes,
            "nprocPerNode": request.cluster.gpus_per_node,
            "gpusPerProcess": 1,
            "config": config,
        }
    }


def values_yaml(document: dict[str, Any]) -> str:
    """The chart values with a header saying what they are; a comment only when nothing fits."""
    if document["chart_values"] is None:
        return "# lmforge-train plan: no layout fits, so there are no values to render\n"
    best, cluster, model = document["recommended"], document["cluster"], document["model"]
    step = best["step"]
    header = [
        f"# lmforge-train plan: {model['preset']} on {cluster['nodes']} × {cluster['gpus_per_node']} "
        f"{cluster['gpu']} ({cluster['precision']})",
        f"# predicted step {step['step_seconds']:.2f} s, MFU {step['mfu']:.0%} "
        f"({step['mfu_range'][0]:.0%}–{step['mfu_range'][1]:.0%}), "
        f"{_gib(best['memory_bytes']['total']):.1f} GiB per GPU; "
        f"{best['run']['wall_clock_days']:.1f} days for {document['workload']['tokens']:.3g} tokens",
    ]
    if cluster["precision"] == "fp8":
        header.append("# precision fp8: train with Float8 linears (the trainer's float8 option)")
    if cluster["nodes"] > 1:
        header.append("# more than one node: add training.checkpoints.persistentVolumeClaim (a ReadWriteMany claim)")
    return "\n".join(header) + "\n" + yaml.safe_dump(document["chart_values"], sort_keys=False)


def _gib(value: float) -> float:
    return value / 2**30


def _seconds(value: float) -> str:
    return f"{value * 1e3:.0f} ms" if value < 1 else f"{value:.2f} s"


def _link(comm: dict[str, Any]) -> str:
    return comm["link"] + (", overlapped" if comm["overlapped"] else "")


def table(document: dict[str, Any]) -> str:
    """The plan for a terminal: the recommendation in full, then the candidates, then the values."""
    model, cluster, workload, flops = (document[k] for k in ("model", "cluster", "workload", "flops"))
    lines = [
        f"model      {model['preset']}: {model['params'] / 1e9:.2f}B parameters"
        + (f" ({model['active_params'] / 1e9:.2f}B active)" if model["experts"] else "")
        + f", {model['layers']} layers, d={model['dim']}, {model['heads']} heads / {model['kv_heads']} KV, "
        f"vocab {model['vocab']}; bf16 weights {model['weights_bf16_bytes'] / 1e9:.0f} GB",
        f"workload   {workload['tokens']:.3g} tokens, sequences of {workload['seq_len']}, global batch "
        f"{workload['global_batch_sequences']} sequences ({workload['global_batch_tokens'] / 2**20:.1f}Mi tokens)",
        f"cluster    {cluster['nodes']} × {cluster['gpus_per_node']} {cluster['gpu']} = {cluster['gpus']} GPUs, "
        f"{cluster['precision']} peak {cluster['peak_flops_per_gpu'] / 1e12:.0f} TFLOP/s, "
        f"{cluster['memory_bytes_per_gpu'] / 1e9:.0f} GB "
        f"({_gib(cluster['usable_memory_bytes_per_gpu']):.1f} GiB usable), "
        f"NVLink {cluster['nvlink_bytes_per_s'] / 1e9:.0f} GB/s, network "
        f"{cluster['network_bytes_per_s'] * 8 / 1e9:.0f} Gb/s per GPU",
        f"FLOPs      6·N·D {flops['six_n_d']:.3g}; with attention {flops['with_attention']:.3g}",
        f"layouts    {document['evaluated_layouts']} evaluated, {document['candidate_count']} kept (best micro-batch "
        f"each), {document['fitting_count']} fit",
        "",
    ]
    best = document["recommended"]
    if best is None:
        smallest = document["smallest_memory"]
        lines.append(
            f"NO LAYOUT FITS: the smallest needs {_gib(smallest['memory_bytes']['total']):.1f} GiB per GPU "
            f"({_describe(smallest['layout'])}); add GPUs, shorten sequences or use a GPU with more memory"
        )
    else:
        lines += _recommendation(best, cluster, document["assumptions"]["compute_efficiency"])
    lines += ["", "candidates (fastest fitting first; memory in GiB per GPU)", _candidate_table(document["candidates"])]
    if best is not None:
        lines += ["", "chart values (helm/lmforge `training:`):", values_yaml(document).rstrip()]
    return "\n".join(lines) + "\n"


def _describe(layout: dict[str, Any]) -> str:
    axes = [f"{axis}={layout[axis]}" for axis in ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep")]
    return (
        " ".join(axes) + f", micro-batch {layout['micro_batch']} × {layout['microbatches']}, "
        f"activation checkpointing {'on' if layout['activation_checkpointing'] else 'off'}"
    )


def _recommendation(best: dict[str, Any], cluster: dict[str, Any], efficiency: dict[str, Any] | None) -> list[str]:
    memory, step, run = best["memory_bytes"], best["step"], best["run"]
    lines = [
        f"recommended  {_describe(best['layout'])}",
        "  memory per GPU (GiB): "
        + ", ".join(
            f"{part} {_gib(memory[part]):.1f}"
            for part in ("params", "grads", "optimizer", "fsdp_buffers", "activations", "output_layer", "total")
        )
        + ";",
        f"    activations without checkpointing {_gib(memory['activations_without_ac']):.1f}, "
        f"with {_gib(memory['activations_with_ac']):.1f}",
        "  communication per step:",
    ]
    for axis, comm in best["communication"].items():
        lines.append(
            f"    {axis:<13} {comm['collective']:<28} {comm['bytes'] / 1e9:9.1f} GB  "
            f"{_seconds(comm['seconds']):>9}  ({_link(comm)})"
        )
    lines += [
        f"  pipeline bubble (P−1)/M {best['pipeline_bubble']:.1%}",
        f"  step {step['step_seconds']:.2f} s (range {step['step_seconds_range'][0]:.2f}–"
        f"{step['step_seconds_range'][1]:.2f}): compute {step['compute_seconds']:.2f}, bubble "
        f"{step['bubble_seconds']:.2f}, exposed communication {step['exposed_comm_seconds']:.2f}, unhidden "
        f"FSDP/HSDP {step['unhidden_overlap_seconds']:.2f}",
        f"  MFU {step['mfu']:.1%} (range {step['mfu_range'][0]:.1%}–{step['mfu_range'][1]:.1%})"
        + (f" of the {cluster['precision']} peak" if cluster["precision"] != "bf16" else ""),
        *_efficiency_lines(efficiency),
        f"  run: {run['steps']} steps, {run['wall_clock_days']:.1f} days (range {run['wall_clock_days_range'][0]:.1f}"
        f"–{run['wall_clock_days_range'][1]:.1f}), {run['gpu_hours']:.3g} GPU-hours"
        + (
            f", ${run['cost_usd']:,.0f} at ${cluster['usd_per_gpu_hour']}/GPU-hour"
            if run["cost_usd"] is not None
            else ""
        ),
    ]
    return lines


def _efficiency_lines(efficiency: dict[str, Any] | None) -> list[str]:
    if efficiency is None:  # --mfu: a measured MFU replaced the model
        return []
    float8 = efficiency["float8_speedup"]
    return [
        f"  kernel efficiency {efficiency['at_this_model']:.1%} of the bf16 peak at matmul width "
        f"{efficiency['matmul_width']:,.0f} ({efficiency['peak_share']:.1%} · (1 − exp(−width / "
        f"{efficiency['width_scale']:,.0f})), fitted to measured runs; range ×{efficiency['band'][0]:.2f}–"
        f"{efficiency['band'][1]:.2f})" + (f"; Float8 linears {float8:.2f}× bf16" if float8 is not None else ""),
    ]


def _candidate_table(candidates: list[dict[str, Any]]) -> str:
    head = (
        "dp_rep",
        "dp_shard",
        "tp",
        "pp",
        "cp",
        "ep",
        "mb",
        "M",
        "AC",
        "act",
        "act(AC)",
        "total",
        "fits",
        "step s",
        "MFU",
        "bubble",
    )
    rows = [head]
    for c in candidates:
        layout, memory, step = c["layout"], c["memory_bytes"], c["step"]
        rows.append(
            (
                *(
                    str(layout[a])
                    for a in ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "micro_batch", "microbatches")
                ),
                "on" if layout["activation_checkpointing"] else "off",
                f"{_gib(memory['activations_without_ac']):.1f}",
                f"{_gib(memory['activations_with_ac']):.1f}",
                f"{_gib(memory['total']):.1f}",
                "yes" if c["fits"] else "NO",
                f"{step['step_seconds']:.2f}",
                f"{step['mfu']:.1%}",
                f"{c['pipeline_bubble']:.1%}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in rows)
