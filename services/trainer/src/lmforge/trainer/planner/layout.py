"""A candidate layout: the degrees of the trainer's `parallel:` axes, the micro-batching, and
activation checkpointing; and which link each axis's collectives travel on.

The device mesh is ordered (pp, dp_replicate, dp_shard, cp, tp), torchtitan's order: TP is the
innermost axis (consecutive ranks, inside a node), PP the outermost (across nodes). Expert
parallelism borrows its ranks from dp_shard × cp (its innermost `ep` of them), as torchtitan
does, so it adds no GPUs. An axis stays inside a node when the ranks it spans (its degree times
the degrees inside it) fit in one node; otherwise its collectives run at the network's rate,
which for a ring over nodes with one NIC per GPU is each GPU's NIC.
"""

from __future__ import annotations

from dataclasses import dataclass

AXES = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep")


@dataclass(frozen=True)
class Layout:
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    cp: int
    ep: int
    micro_batch: int  # sequences per data-parallel rank per micro-batch
    microbatches: int  # per step: the pipeline's micro-batches, or gradient-accumulation steps without PP
    activation_checkpointing: bool

    @property
    def gpus(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        """Data-parallel ranks: each takes its own sequences."""
        return self.dp_replicate * self.dp_shard

    @property
    def fsdp(self) -> int:
        """Ranks one parameter shard is spread over: dp_shard × cp (context-parallel ranks hold the
        same parameters, so FSDP shards over them too, as in torchtitan)."""
        return self.dp_shard * self.cp

    @property
    def pipeline_bubble(self) -> float:
        """1F1B's idle fraction relative to the ideal time, (P − 1)/M (Narayanan et al. 2021)."""
        return (self.pp - 1) / self.microbatches

    def axes(self) -> dict[str, int]:
        return {axis: getattr(self, axis) for axis in AXES}

    def spans(self) -> dict[str, int]:
        """Consecutive ranks each axis's groups reach across (their degree times the inner degrees)."""
        tp_cp = self.tp * self.cp
        return {
            "tp": self.tp,
            "cp": tp_cp,
            "ep": self.tp * self.ep,
            "fsdp": tp_cp * self.dp_shard,
            "dp_replicate": tp_cp * self.dp,
            "pp": self.gpus,
        }

    def inside_node(self, gpus_per_node: int) -> dict[str, bool]:
        """Per axis: True when its collectives stay on NVLink."""
        return {axis: span <= gpus_per_node for axis, span in self.spans().items()}

    def describe(self) -> str:
        parts = [f"{axis}={value}" for axis, value in self.axes().items() if value > 1] or ["single GPU"]
        return (
            " ".join(parts)
            + f", micro-batch {self.micro_batch} × {self.microbatches}"
            + (", AC" if self.activation_checkpointing else "")
        )
