"""The plan's inputs (a PlanRequest) from `lmforge-train plan`'s arguments (command.py declares them)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from lmforge.common.config import cli_overrides, format_validation_error
from lmforge.common.errors import ConfigError

if TYPE_CHECKING:  # the planner's modules import the model's, and torch: only when a plan is made
    from lmforge.model.config import GPTConfig
    from lmforge.trainer.planner.search import PlanRequest

DEFAULT_GLOBAL_BATCH_TOKENS = 4 * 2**20
CHINCHILLA_TOKENS_PER_PARAM = 20  # Hoffmann et al. 2022


def _model_config(preset: str, overrides: dict) -> GPTConfig:
    """The trainer's own model config (model.preset + model.overrides)."""
    from pydantic import ValidationError

    from lmforge.trainer.config import ModelSection

    try:
        return ModelSection(preset=preset, overrides=overrides).build()
    except ValidationError as exc:
        problems = format_validation_error(exc, "--shape").splitlines()[1:]
        raise ConfigError("invalid --shape: " + "; ".join(line.strip() for line in problems)) from exc


def build_request(args: argparse.Namespace) -> tuple[PlanRequest, dict]:
    """The plan's inputs from the arguments; raises ConfigError naming the bad one."""
    from lmforge.trainer.planner.hardware import Cluster, gpu_named
    from lmforge.trainer.planner.memory import StateConfig
    from lmforge.trainer.planner.search import PlanRequest
    from lmforge.trainer.planner.shape import ModelShape

    overrides = cli_overrides(args.shape)
    config = _model_config(args.model, overrides)
    seq_len = args.seq_len or config.context_length
    if seq_len > config.context_length:  # the trainer needs the context to hold a sequence
        overrides["context_length"] = seq_len
        config = _model_config(args.model, overrides)
    shape = ModelShape.from_config(config)

    gpu = gpu_named(args.gpu)
    cluster = Cluster(
        gpu=gpu,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        nvlink_bytes_per_s=(args.nvlink_gb_per_s or gpu.nvlink_bytes_per_s / 1e9) * 1e9,
        network_bytes_per_s=(args.network_gbit_per_s or gpu.network_bits_per_s / 1e9) * 1e9 / 8,
        comm_efficiency=args.comm_efficiency,
        usd_per_gpu_hour=args.usd_per_gpu_hour,
        peak_flops_override=args.peak_tflops * 1e12 if args.peak_tflops else None,
    )
    if args.global_batch_sequences is not None:
        global_batch = args.global_batch_sequences
    else:
        global_batch = int((args.global_batch_tokens or DEFAULT_GLOBAL_BATCH_TOKENS) // seq_len)
    if global_batch < 1:
        raise ConfigError(f"--global-batch-tokens is less than one sequence of {seq_len} tokens")
    state = StateConfig(
        param_dtype=args.param_dtype,
        grad_dtype=args.grad_dtype,
        moment_dtype=args.moment_dtype,
        master_weights=args.master_weights,
        reduce_dtype=args.reduce_dtype,
    )
    pinned = {
        axis: getattr(args, f"pin_{axis}")
        for axis in ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "micro_batch")
        if getattr(args, f"pin_{axis}") is not None
    }
    request = PlanRequest(
        shape=shape,
        cluster=cluster,
        seq_len=seq_len,
        global_batch=global_batch,
        tokens=args.tokens or CHINCHILLA_TOKENS_PER_PARAM * shape.params,
        precision=args.precision,
        state=state,
        activation_checkpointing=args.activation_checkpointing,
        flash_attention=args.flash_attention,
        memory_headroom=args.memory_headroom,
        fixed_mfu=args.mfu,
        attention_flops=args.flops_convention != "6N",
        pinned=pinned,
    )
    return request, {"preset": args.model, "overrides": overrides}
