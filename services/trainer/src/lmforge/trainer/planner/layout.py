"""A candidate layout is the trainer's own layout type, lmforge.trainer.layout_rules.MeshLayout: the
degrees of the `parallel:` axes, the micro-batching, activation checkpointing and the data-parallel
wrapper, and (`spans`, `inside_node`) which link each axis's collectives travel on. The planner names
it `Layout`; the rules for which layouts the trainer runs are layout_rules's, asked by the search.

The device mesh is ordered (pp, dp_replicate, dp_shard, cp, tp), torchtitan's order: TP is the
innermost axis (consecutive ranks, inside a node), PP the outermost (across nodes). Expert
parallelism borrows its ranks from dp_shard (its innermost `ep` of them), as torchtitan does, so it
adds no GPUs. An axis stays inside a node when the ranks it spans (its degree times the degrees
inside it) fit in one node; otherwise its collectives run at the network's rate, which for a ring
over nodes with one NIC per GPU is each GPU's NIC.
"""

from __future__ import annotations

from lmforge.trainer.layout_rules import MESH_AXES as AXES
from lmforge.trainer.layout_rules import MeshLayout as Layout

__all__ = ["AXES", "Layout"]
