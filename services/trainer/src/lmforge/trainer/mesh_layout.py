"""The trainer's device mesh as named axes, `parallel: {dp_replicate, dp_shard, tp, pp, cp, ep}`
(`lmforge-train plan` writes its recommendation in them), resolved against the
world size and checked before any process group exists.

dp_replicate × dp_shard × tp × pp × cp is the world size; one of them may be -1, the rest of it.
ep borrows its ranks from dp_shard × cp (torchtitan's expert parallelism), so it must divide
them and adds none. `mode`, the older form, names the data-parallel wrapper and fills its axis:
ddp fills dp_replicate, fsdp dp_shard, hsdp dp_shard with dp_replicate = replicate_degree (the
same axis). Without `mode` the wrapper follows the degrees: ddp when only dp_replicate > 1, fsdp
when dp_shard > 1, hsdp when both; cp > 1 counts as dp_shard's (FSDP shards over dp_shard × cp).
The trainer runs every axis: tp with FSDP or HSDP or alone (torch's DDP takes no DTensor
parameters), cp under FSDP or HSDP, pp (lmforge.trainer.pipeline_training) without DDP, and ep
for the MoE option. The DeviceMesh's axes are in MESH_ORDER: pp outermost, tp innermost (a tp
group is consecutive ranks, inside a node), as torchtitan's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lmforge.common.errors import ConfigError

if TYPE_CHECKING:
    from lmforge.trainer.config import ParallelSection

MESH_AXES = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep")
WORLD_AXES = ("dp_replicate", "dp_shard", "tp", "pp", "cp")  # their product is the world size
MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "tp")  # the DeviceMesh's dimensions, outermost first
FILL = -1
MODE_FILLS = {"ddp": "dp_replicate", "fsdp": "dp_shard", "hsdp": "dp_shard"}  # the axis each mode fills


@dataclass(frozen=True)
class MeshLayout:
    """The degrees with -1 filled in, and the data-parallel wrapper around the model."""

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    mode: str = "none"

    @property
    def world_size(self) -> int:
        return math.prod(getattr(self, axis) for axis in WORLD_AXES)

    def axes(self) -> dict[str, int]:
        return {axis: getattr(self, axis) for axis in MESH_AXES}


def wrapper_mode(degrees: Mapping[str, int]) -> str:
    """The data-parallel wrapper the (filled) degrees call for."""
    # context parallelism runs under FSDP over dp_shard × cp (whose reduce-scatter sums the cp ranks' gradients)
    replicate, shard = degrees["dp_replicate"] > 1, degrees["dp_shard"] > 1 or degrees["cp"] > 1
    if shard:
        return "hsdp" if replicate else "fsdp"
    return "ddp" if replicate else "none"


def section_problems(parallel: ParallelSection) -> list[str]:
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


def resolve_layout(parallel: ParallelSection, world_size: int) -> MeshLayout:
    """The section's degrees at this world size; ConfigError naming the axis and the world size."""
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
    shard_ranks = degrees["dp_shard"] * degrees["cp"]
    if shard_ranks % degrees["ep"]:
        raise ConfigError(
            f"parallel.ep={degrees['ep']} must divide dp_shard × cp = {shard_ranks} at world size "
            f"{world_size}: expert parallelism borrows its ranks from them"
        )
    if parallel.pp_microbatches is not None and degrees["pp"] == 1:  # pp=-1 filled to 1
        raise ConfigError(f"parallel.pp_microbatches is for a pipeline, but pp fills to 1 at world size {world_size}")
    return MeshLayout(**degrees, mode=parallel.mode or wrapper_mode(degrees))


def trainer_layout(parallel: ParallelSection, world_size: int) -> MeshLayout:
    """The layout the trainer runs: resolved, and refused (one line) for a combination it does not run."""
    layout = resolve_layout(parallel, world_size)
    if layout.cp > 1 and layout.mode in ("none", "ddp"):
        raise ConfigError(
            f"parallel.cp={layout.cp} with parallel.mode {layout.mode} (world size {world_size}): context "
            "parallelism runs under FSDP over dp_shard × cp, which sums the cp ranks' gradients; leave mode "
            "out or use fsdp or hsdp"
        )
    if layout.tp > 1 and layout.mode == "ddp":
        raise ConfigError(
            f"parallel.tp={layout.tp} with DDP (dp_replicate={layout.dp_replicate}, world size {world_size}): "
            "torch's DDP takes no tensor-parallel (DTensor) parameters; use dp_shard (FSDP) or hsdp for the "
            "data-parallel axis"
        )
    return layout


def _requested(parallel: ParallelSection) -> tuple[dict[str, int], list[str]]:
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


def _product(degrees: Mapping[str, int], fill: str | None, parallel: ParallelSection) -> str:
    """The fixed axes above 1 as `dp_replicate=2 × tp=4` (all axes when none is)."""
    named = [f"{axis}={degrees[axis]}" for axis in WORLD_AXES if axis != fill and degrees[axis] > 1]
    text = " × ".join(named) or " × ".join(f"{axis}=1" for axis in WORLD_AXES if axis != fill)
    if parallel.mode == "hsdp" and parallel.replicate_degree > 1:
        text += " (dp_replicate is hsdp's replicate_degree)"
    return text
