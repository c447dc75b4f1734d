"""The trainer's `parallel:` section, `{dp_replicate, dp_shard, tp, pp, cp, ep}` (`lmforge-train plan`
writes its recommendation in them), resolved against the world size into a layout
(lmforge.trainer.layout_rules.MeshLayout) and checked before any process group exists.

dp_replicate × dp_shard × tp × pp × cp is the world size; one of them may be -1, the rest of it.
`mode`, the older form, names the data-parallel wrapper and fills its axis: ddp fills
dp_replicate, fsdp dp_shard, hsdp dp_shard with dp_replicate = replicate_degree (the same axis).
Without `mode` the wrapper follows the degrees (layout_rules.wrapper_mode). What a layout may
split, and with which wrapper, is the rulebook's (lmforge.trainer.layout_rules): `trainer_layout`
refuses what it refuses without the model and the sequence length.

The section is read through `ParallelSettings` (the fields used here), so this module does not
import lmforge.trainer.config, which imports it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Protocol

from lmforge.common.errors import ConfigError
from lmforge.trainer.layout_rules import (
    MESH_AXES,
    MESH_ORDER,
    WORLD_AXES,
    MeshLayout,
    layout_problems,
    refuse,
    wrapper_mode,
)

# MESH_AXES, MESH_ORDER, MeshLayout and wrapper_mode are the rulebook's, named here too for older imports.
__all__ = [
    "FILL", "MESH_AXES", "MESH_ORDER", "MODE_FILLS", "WORLD_AXES", "MeshLayout", "ParallelSettings",
    "resolve_layout", "section_problems", "trainer_layout", "wrapper_mode",
]

FILL = -1
MODE_FILLS = {"ddp": "dp_replicate", "fsdp": "dp_shard", "hsdp": "dp_shard"}  # the axis each mode fills


class ParallelSettings(Protocol):
    """The fields of lmforge.trainer.config.ParallelSection read here."""

    mode: str | None
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    cp: int
    ep: int
    replicate_degree: int
    pp_microbatches: int | None
    pp_schedule: str
    pp_virtual_stages: int
    activation_checkpointing: bool
    compile: bool


def section_problems(parallel: ParallelSettings) -> list[str]:
    """What is wrong with the section whatever the world size (checked when the config loads)."""
    degrees, problems = _requested(parallel)
    fills = [axis for axis in WORLD_AXES if degrees[axis] == FILL]
    if len(fills) > 1:
        by_mode = f" (mode {parallel.mode} fills {MODE_FILLS[parallel.mode]})" if parallel.mode in MODE_FILLS else ""
        problems.append(
            f"parallel: only one axis may be -1 (the rest of the world size), got {', '.join(fills)}{by_mode}"
        )
    if parallel.pp_microbatches is not None and degrees["pp"] == 1:
        problems.append(
            "parallel.pp_microbatches is for a pipeline (pp > 1); without one, grad_accum sets the "
            "micro-batches per step"
        )
    return problems


def resolve_layout(parallel: ParallelSettings, world_size: int, *, micro_batch: int = 1,
                   grad_accum: int = 1) -> MeshLayout:
    """The section's layout at this world size (ConfigError naming the axis and the world size):
    its degrees, activation checkpointing, and the micro-batches per step: the pipeline's
    (pp_microbatches, default pp) with pp > 1, else grad_accum's; micro_batch is data.batch_size."""
    degrees, _ = _requested(parallel)
    problems = section_problems(parallel)
    if problems:
        raise ConfigError(problems[0])
    fill = next((axis for axis in WORLD_AXES if degrees[axis] == FILL), None)
    fixed = math.prod(degrees[axis] for axis in WORLD_AXES if axis != fill)
    if fill is not None:
        if world_size % fixed:
            raise ConfigError(
                f"parallel.{fill}=-1 cannot fill the world size {world_size}: "
                f"{_product(degrees, fill, parallel)} = {fixed} does not divide it"
            )
        degrees[fill] = world_size // fixed
    elif fixed != world_size:
        if parallel.mode == "none":
            raise ConfigError(f"parallel.mode is 'none' but {world_size} processes were started")
        raise ConfigError(
            f"parallel: {_product(degrees, None, parallel)} = {fixed}, but the world size is {world_size} "
            "(dp_replicate × dp_shard × tp × pp × cp must equal it; one axis may be -1, the rest of it: "
            "e.g. parallel.dp_shard=-1 shards over every rank)"
        )
    if parallel.pp_microbatches is not None and degrees["pp"] == 1:  # pp=-1 filled to 1
        raise ConfigError(f"parallel.pp_microbatches is for a pipeline, but pp fills to 1 at world size {world_size}")
    microbatches = (parallel.pp_microbatches or degrees["pp"]) if degrees["pp"] > 1 else grad_accum
    return MeshLayout(**degrees, micro_batch=micro_batch, microbatches=microbatches,
                      activation_checkpointing=parallel.activation_checkpointing,
                      mode=parallel.mode or wrapper_mode(degrees))


def trainer_layout(parallel: ParallelSettings, world_size: int, *, micro_batch: int = 1,
                   grad_accum: int = 1) -> MeshLayout:
    """The layout the trainer runs: resolved, and refused (one line) for what the rulebook refuses
    without the model and the sequence length (the wrapper, ep's ranks, the pipeline's schedule)."""
    layout = resolve_layout(parallel, world_size, micro_batch=micro_batch, grad_accum=grad_accum)
    refuse(layout_problems(layout, None, None, world_size, pp_schedule=parallel.pp_schedule,
                           pp_virtual_stages=parallel.pp_virtual_stages, compiled=parallel.compile))
    return layout


def _requested(parallel: ParallelSettings) -> tuple[dict[str, int], list[str]]:
    """The degrees asked for with `mode` applied (-1 not yet filled), and where mode and axes disagree."""
    degrees = {axis: getattr(parallel, axis) for axis in MESH_AXES}
    mode, problems = parallel.mode, []
    if mode is None:
        return degrees, problems
    if mode == "hsdp" and parallel.replicate_degree != 1:
        if degrees["dp_replicate"] not in (1, parallel.replicate_degree):
            problems.append(
                f"parallel.replicate_degree {parallel.replicate_degree} and parallel.dp_replicate "
                f"{degrees['dp_replicate']} disagree: they are the same axis, set one"
            )
        degrees["dp_replicate"] = parallel.replicate_degree
    for axis in ("dp_replicate", "dp_shard"):
        if axis == MODE_FILLS.get(mode):
            degrees[axis] = FILL if degrees[axis] == 1 else degrees[axis]
        elif degrees[axis] != 1 and not (mode == "hsdp" and axis == "dp_replicate"):
            problems.append(
                f"parallel.mode {mode} has no {axis} axis (got {degrees[axis]}): give the mesh axes "
                "without mode, or a mode that has it"
            )
    return degrees, problems


def _product(degrees: Mapping[str, int], fill: str | None, parallel: ParallelSettings) -> str:
    """The fixed axes above 1 as `dp_replicate=2 × tp=4` (all axes when none is)."""
    named = [f"{axis}={degrees[axis]}" for axis in WORLD_AXES if axis != fill and degrees[axis] > 1]
    text = " × ".join(named) or " × ".join(f"{axis}=1" for axis in WORLD_AXES if axis != fill)
    if parallel.mode == "hsdp" and parallel.replicate_degree > 1:
        text += " (dp_replicate is hsdp's replicate_degree)"
    return text
