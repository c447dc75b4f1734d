"""Bytes each GPU holds during a step, by part, for one layout.

Model state (per parameter this GPU owns after tensor, pipeline and FSDP sharding): the stored
parameter, its gradient, and AdamW's two moments plus the fp32 master copy when parameters are
stored in bf16 (StateConfig). lmforge's trainer keeps fp32 parameters and gradients under FSDP2
(MixedPrecisionPolicy casts to bf16 for compute and reduces in fp32): 4 + 4 + 8 = 16 bytes per
parameter, the same total as bf16 parameters and gradients with an fp32 master copy.

FSDP buffers: the unsharded bf16 parameters and their gradients of the layers being computed
(this one and the one prefetched); under pipeline parallelism FSDP keeps the whole stage
unsharded across micro-batches (no reshard after forward, gradient sync on the last
micro-batch only), so the stage's bf16 parameters and its fp32 accumulated gradients are held.

Activations per transformer layer, in bytes for s·b tokens (bf16, 2 bytes per element), follow
Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198) §4: sbh(34 + 5as/h) for a GPT layer, and sbh(34 + 5as/h)/t with tensor (t)
and sequence parallelism. Their 34 is, per token: layer norms' inputs 4h; attention's QKV input
2h, Q and K 4h, V 2h, the output projection's input 2h, its dropout mask h (11h); the MLP's input
2h, GeLU's input 8h and output 8h, its dropout mask h (19h); 5as/h is the attention scores and
softmax (2as + as + 2as). Adjusted here:
  - grouped-query attention: K and V are kv_heads·head_dim wide, 4h·(kv_heads/heads) not 4h;
  - the MLP stores 2h + 4f (GeLU: its input and output) or 2h + 8f for SwiGLU (gate, silu(gate),
    up and their product), f the hidden size (f = 4h gives Korthikanti's 18h);
  - an MoE layer: the router's fp32 logits 4E, and each of the top_k·capacity_factor routed copies
    of a token carries an expert input 2h plus its MLP's (a shared expert adds one more MLP);
  - dropout masks (1 byte each) only when the model has dropout (Llama-style presets do not);
  - flash attention (the default, SDPA's fused kernels) stores no as² scores, only each head's
    fp32 log-sum-exp 4a; --no-flash-attention puts 5as back;
  - context parallelism (all-gather of K/V, Llama 3's): s/c tokens per rank, but the gathered
    full-sequence K and V are kept for the backward.
With full activation checkpointing a layer keeps only its input, 2sbh/t (sequence-parallel), and
the backward recomputes one layer at a time: that layer's activations come on top once.

Pipeline parallelism (1F1B) keeps min(P, M) micro-batches in flight on the first stage: its
L/P layers times P micro-batches, i.e. L layers' worth whatever P (Korthikanti §4.2.3). The last
stage holds one, plus the output layer: bf16 logits 2V, the fp32 log-softmax cross-entropy
saves 4V and its gradient 4V per token, split over the tensor-parallel ranks (loss parallel).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from lmforge.common.errors import ConfigError
from lmforge.trainer.planner.layout import Layout
from lmforge.trainer.planner.shape import ModelShape

DTYPE_BYTES = {"fp32": 4, "bf16": 2}
ACTIVATION_BYTES = 2  # bf16 compute
PREFETCHED_LAYERS = 2  # FSDP holds the layer being computed and the next one unsharded


@dataclass(frozen=True)
class StateConfig:
    """How the trainer stores model state (bytes per parameter of each part)."""

    param_dtype: str = "fp32"
    grad_dtype: str | None = None  # default: the parameters' dtype
    moment_dtype: str = "fp32"  # AdamW's exp_avg and exp_avg_sq
    master_weights: bool | None = None  # an fp32 copy for the optimizer; default: when parameters are bf16
    reduce_dtype: str = "fp32"  # the gradient reduce-scatter / all-reduce

    def __post_init__(self):
        for name in ("param_dtype", "grad_dtype", "moment_dtype", "reduce_dtype"):
            value = getattr(self, name)
            if value is not None and value not in DTYPE_BYTES:
                raise ConfigError(f"{name}: {value!r} is not one of {sorted(DTYPE_BYTES)}")

    @property
    def param_bytes(self) -> int:
        return DTYPE_BYTES[self.param_dtype]

    @property
    def grad_bytes(self) -> int:
        return DTYPE_BYTES[self.grad_dtype or self.param_dtype]

    @property
    def optimizer_bytes(self) -> int:
        master = self.master_weights if self.master_weights is not None else self.param_dtype != "fp32"
        return 2 * DTYPE_BYTES[self.moment_dtype] + (4 if master else 0)

    @property
    def reduce_bytes(self) -> int:
        return DTYPE_BYTES[self.reduce_dtype]


@dataclass(frozen=True)
class Memory:
    """Bytes per GPU (the most loaded pipeline stage) by part."""

    params: float
    grads: float
    optimizer: float
    fsdp_buffers: float
    activations: float  # with the layout's activation checkpointing choice
    activations_without_ac: float
    activations_with_ac: float
    output_layer: float  # logits and the loss's fp32 tensors (last stage)

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.fsdp_buffers + self.activations + self.output_layer

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


def stage_params(shape: ModelShape, layout: Layout, stage: str) -> tuple[float, float]:
    """(dense, routed experts): the parameters one GPU of a `stage` ("first", "last" or "only")
    computes with, unsharded by FSDP: its layers and its end's embedding or head, the dense matrices
    split over the TP ranks and the routed experts over the EP ranks (the trainer does not split MoE
    layers over tp: lmforge.trainer.layout_rules refuses tp > 1 with them)."""
    layers = shape.layers // layout.pp
    dense = layers * (shape.layer_params - shape.layer_expert_params)
    if stage in ("first", "only"):
        dense += shape.embedding_params
    if stage in ("last", "only"):
        dense += shape.head_params + (shape.embedding_params if shape.tied and stage == "last" else 0)
    experts = layers * shape.layer_expert_params / layout.ep
    return dense / layout.tp, experts


def layer_activation_bytes(shape: ModelShape, layout: Layout, seq_len: int, flash_attention: bool = True) -> float:
    """One layer's stored activations on one GPU for one micro-batch (see the module docstring)."""
    h, f = shape.dim, shape.ffn_hidden
    local_tokens = seq_len // layout.cp * layout.micro_batch
    kv_width = 2 * shape.kv_heads * shape.head_dim  # K and V
    mask = 1 if shape.dropout else 0
    per_token = 4 * h  # the two norms' inputs
    per_token += 2 * h + 2 * h + 2 * h + mask * h  # QKV input, Q, output projection input, its dropout mask
    per_token += 4 * shape.heads if flash_attention else 5 * shape.heads * seq_len
    mlp = 2 * h + (8 * f if shape.swiglu else 4 * f)
    if shape.is_moe:
        copies = shape.top_k * shape.capacity_factor + shape.shared_expert
        per_token += 2 * h + 4 * shape.experts + copies * mlp
    else:
        per_token += mlp
    per_token += mask * h
    kv_tokens = seq_len * layout.micro_batch  # the full sequence: all-gathered under CP
    return (local_tokens * per_token + kv_tokens * 2 * kv_width) / layout.tp


def memory_per_gpu(
    shape: ModelShape, layout: Layout, seq_len: int, state: StateConfig, flash_attention: bool = True
) -> Memory:
    """The most loaded stage's bytes per GPU (the first and last stages differ under PP). Its
    activations_without_ac / activations_with_ac are those of the most loaded stage under each
    choice (without checkpointing the first stage's in-flight micro-batches weigh most, with it
    often the last stage's output layer)."""
    stages = ("only",) if layout.pp == 1 else ("first", "last")

    def most_loaded(checkpointing: bool) -> Memory:
        candidate = replace(layout, activation_checkpointing=checkpointing)
        return max(
            (_stage_memory(shape, candidate, seq_len, state, flash_attention, stage) for stage in stages),
            key=lambda memory: memory.total,
        )

    without, with_ac = most_loaded(False), most_loaded(True)
    chosen = with_ac if layout.activation_checkpointing else without
    return replace(chosen, activations_without_ac=without.activations, activations_with_ac=with_ac.activations)


def _stage_memory(
    shape: ModelShape, layout: Layout, seq_len: int, state: StateConfig, flash_attention: bool, stage: str
) -> Memory:
    dense, experts = stage_params(shape, layout, stage)
    # FSDP spreads the weights over dp_shard·cp ranks, but under expert parallelism the routed
    # experts are FSDP's ignored parameters (lmforge.trainer.expert_parallel): each GPU holds its
    # E/ep experts whole.
    sharded = dense if layout.ep > 1 else dense + experts
    owned = sharded / layout.fsdp + (experts if layout.ep > 1 else 0.0)
    layer_sharded = (shape.layer_params - (shape.layer_expert_params if layout.ep > 1 else 0)) / layout.tp
    if layout.fsdp == 1:
        buffers = 0.0
    elif layout.pp > 1:  # the stage stays unsharded: bf16 parameters, fp32 accumulated gradients
        buffers = sharded * (ACTIVATION_BYTES + state.reduce_bytes)
    else:
        buffers = PREFETCHED_LAYERS * layer_sharded * (ACTIVATION_BYTES + state.reduce_bytes)

    layer = layer_activation_bytes(shape, layout, seq_len, flash_attention)
    layers = shape.layers // layout.pp
    in_flight = min(layout.pp, layout.microbatches) if stage in ("first", "only") else 1
    local_tokens = seq_len // layout.cp * layout.micro_batch
    checkpoint = ACTIVATION_BYTES * local_tokens * shape.dim / layout.tp  # a layer's input, sequence-parallel
    without_ac = in_flight * layers * layer
    with_ac = in_flight * layers * checkpoint + layer
    output = local_tokens * 10 * shape.vocab / layout.tp if stage in ("last", "only") else 0.0
    return Memory(
        params=owned * state.param_bytes,
        grads=owned * state.grad_bytes,
        optimizer=owned * state.optimizer_bytes,
        fsdp_buffers=buffers,
        activations=with_ac if layout.activation_checkpointing else without_ac,
        activations_without_ac=without_ac,
        activations_with_ac=with_ac,
        output_layer=output,
    )
