"""Trainer configuration (pydantic; YAML, then LMFORGE_TRAINER__… env, then key=value)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from lmforge.common.config import StrictModel, load_config
from lmforge.model.config import GPTConfig, RopeScaling
from lmforge.trainer.mesh_layout import section_problems

ENV_PREFIX = "LMFORGE_TRAINER"


class ModelSection(StrictModel):
    preset: str = "tiny"
    overrides: dict[str, Any] = Field(default_factory=dict, description="any GPTConfig field, e.g. n_layer: 2")
    init_from: str = Field("", description="continued pretraining: a local model package (lmforge or Hugging Face "
                           "format) whose architecture and weights the run starts from; preset is then unused")

    def build(self, vocab_size: int | None = None) -> GPTConfig:
        fields = dict(self.overrides)
        if vocab_size is not None:
            fields.setdefault("vocab_size", vocab_size)
        return GPTConfig.preset(self.preset, **fields)


class DataSourceSection(StrictModel):
    path: str = Field(description="a data-prep output directory (manifest.json, shards/)")
    weight: float = Field(1.0, ge=0)


class DataSection(StrictModel):
    sources: list[DataSourceSection] = Field(min_length=1)
    seq_len: int = Field(256, ge=1)
    batch_size: int = Field(8, ge=1, description="sequences per rank per micro-step")
    verify_sha256: bool = Field(True, description="hash every local shard against manifest.json at start "
                                "(s3:// blocks are always verified when first fetched)")
    cache_dir: str = Field("", description="the node's cache of blocks of s3:// sources, shared by its ranks "
                           "(default: RUN_DIR/data-cache)")
    cache_bytes: int = Field(64 << 30, ge=1, description="bound of the block cache: least recently used blocks "
                             "are evicted beyond it (s3:// sources are streamed, never copied whole)")
    prefetch: int = Field(8, ge=0, description="batches loaded at once ahead of the step, in background threads "
                          "(0: none); enough to hide the object store's latency for s3:// sources")
    shuffle: Literal["blocks", "global"] = Field(
        "blocks", description="blocks: each epoch, units of shuffle_unit_blocks storage blocks in a keyed order, "
        "sequences shuffled within windows of shuffle_window_blocks, so a fetched block is used whole while cached "
        "(for corpora far larger than the cache); global: uniform over the whole corpus (about one block fetched per "
        "sequence once the corpus outgrows the cache). Either way the batches are a pure function of the seed, the "
        "step and the position in the step's global batch: a restart, or another world size or grad_accum with the "
        "same global batch and settings, reads exactly the same ones")
    shuffle_streams: int = Field(8, ge=1, description="blocks: groups of global-batch positions, each reading its own "
                                 "units (MosaicML's canonical nodes); a multiple of the number of nodes keeps every "
                                 "node to its own blocks. Used: the largest divisor of the step's global batch "
                                 "(sequences per rank per micro-step x grad_accum x data-parallel ranks) that is at "
                                 "most this and at most the smallest source's sequences")
    shuffle_window_blocks: int = Field(128, ge=1, description="blocks: storage blocks whose sequences are shuffled "
                                       "together (128 blocks of 4 MiB: 512 MiB); the cache needs about two windows per "
                                       "stream the node reads, per source")
    shuffle_unit_blocks: int = Field(8, ge=1, description="blocks: consecutive storage blocks kept together in the "
                                     "epoch's order; reading a unit fetches one block more than it holds, so bytes "
                                     "fetched per byte trained are about (n + 1) / n")
    shuffle_mixture_chunk: int = Field(1024, ge=1, description="blocks: each stream's draws come in chunks of this "
                                       "many, which hold each source's share of the weights exactly (largest "
                                       "remainder); a source with a weight needs at least one draw a chunk")
    document_masking: bool = Field(False, description="attention within a document only (documents end at the "
                                   "tokenizer's end-of-text token); a schedule stage longer than data.seq_len "
                                   "turns it on unless the stage says otherwise")


class StageSection(StrictModel):
    """One stage of the recipe (lmforge.trainer.schedule): from start_tokens consumed tokens on, until the next
    stage's. A field left unset keeps the previous stage's value (the first stage's: data's and model's)."""

    name: str = Field("", description="shown in the metrics and the report (default: stage-N)")
    start_tokens: int = Field(0, ge=0, description="tokens consumed before the stage starts (the first: 0); it "
                              "starts at the first step that begins at or past it")
    global_batch_tokens: int | None = Field(None, ge=1, description="tokens per optimizer step, whatever the world "
                                            "size (required on the first stage): seq_len x the global batch in "
                                            "sequences, realised by micro-batches of data.batch_size sequences "
                                            "(or this stage's batch_size) per rank")
    seq_len: int | None = Field(None, ge=1, description="tokens per sequence: the same token stream packed into "
                                "longer sequences (every stage's divides the longest, and the shortest divides "
                                "every stage's)")
    batch_size: int | None = Field(None, ge=1, description="sequences per rank per micro-step (default: the "
                                   "tokens of data.batch_size x data.seq_len, at this seq_len)")
    mixture: dict[str, float] | None = Field(None, description="weights by source name (the last part of "
                                             "data.sources' paths); a source left out gets 0")
    rope_theta: float | None = Field(None, gt=0, description="RoPE base for this stage (model.rope_theta at first)")
    rope_scaling: RopeScaling | None = Field(None, description="Llama 3's RoPE frequency scaling for this stage")
    document_masking: bool | None = Field(None, description="default: on for a stage longer than data.seq_len, "
                                          "else data.document_masking")
    mesh: dict[Literal["dp_replicate", "dp_shard", "tp", "pp", "cp", "ep"], int] | None = Field(
        None, description="the mesh degrees the stage is planned for (lmforge-train plan --schedule), e.g. "
        "{dp_shard: 64, tp: 8, cp: 2}: a run on another mesh stops before the stage (exit 8), its previous "
        "step checkpointed, to be resumed on this one; unset: the previous stage's (the first's: any)")


class OptimSection(StrictModel):
    lr: float = Field(1e-3, gt=0)
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = Field(0.1, ge=0)
    eps: float = Field(1e-8, gt=0)
    grad_clip: float = Field(1.0, gt=0)
    warmup_steps: int = Field(10, ge=0, description="the LR is a function of consumed tokens: warmup ends at "
                              "the tokens of the first warmup_steps steps")
    schedule: Literal["cosine", "wsd"] = "cosine"
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    decay_fraction: float = Field(0.2, gt=0, le=1, description="wsd: share of the run's tokens spent decaying")


def _degree(value: int) -> int:
    if value == 0:
        raise ValueError("a degree is a number of ranks (1 or more), or -1 for the rest of the world size")
    return value


# A mesh axis's degree: ranks, or -1 = the rest of the world size (lmforge.trainer.mesh_layout).
MeshDegree = Annotated[int, Field(ge=-1, json_schema_extra={"not": {"const": 0}}), AfterValidator(_degree)]


# The device mesh: dp_replicate × dp_shard × tp × pp × cp ranks = the world size (one axis may
# be -1, the rest of it); the rules, and how `mode` relates, are lmforge.trainer.mesh_layout's.
class ParallelSection(StrictModel):
    mode: Literal["none", "ddp", "fsdp", "hsdp"] | None = Field(
        None, description="the data-parallel wrapper; it fills its axis (ddp dp_replicate, fsdp and hsdp "
        "dp_shard). Unset: from the degrees (ddp: only dp_replicate > 1; fsdp: dp_shard > 1; hsdp: both)")
    dp_replicate: MeshDegree = Field(1, description="data-parallel replicas (DDP, or HSDP's replica groups). "
                                     "dp_replicate x dp_shard x tp x pp x cp = the world size; one of them may "
                                     "be -1: the rest of it")
    dp_shard: MeshDegree = Field(1, description="ranks the parameters are sharded over (FSDP); -1: the rest")
    tp: MeshDegree = Field(1, description="tensor-parallel ranks, inside a node; -1: the rest")
    pp: MeshDegree = Field(1, description="pipeline stages, across nodes; -1: the rest")
    cp: MeshDegree = Field(1, description="context-parallel ranks, each holding 2 of 2·cp chunks of every "
                           "sequence (data.seq_len divisible by 2·cp; FSDP shards over dp_shard x cp); -1: the rest")
    ep: int = Field(1, ge=1, description="expert-parallel ranks for the MoE option's experts, borrowed from "
                    "dp_shard (it must divide dp_shard and num_experts)")
    pp_microbatches: int | None = Field(None, ge=1, description="pipeline micro-batches per step, each "
                                        "data.batch_size sequences (pp > 1 only; default: pp)")
    pp_schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = Field(
        "1f1b", description="the pipeline schedule (pp > 1); interleaved_1f1b needs pp_virtual_stages >= 2")
    pp_virtual_stages: int = Field(1, ge=1, description="model chunks per pipeline rank (interleaved_1f1b: 2 or "
                                   "more); n_layer must divide into pp x pp_virtual_stages")
    reshard_after_forward: bool = Field(True, description="False = shard-grad-op (ZeRO-2-like)")
    replicate_degree: int = Field(1, ge=1, description="hsdp: replica groups (the mesh is replicate x shard); "
                                  "the same axis as dp_replicate")
    mixed_precision: bool = Field(True, description="bf16 params/compute, fp32 reduction; GPU only")
    activation_checkpointing: bool = False
    compile: bool = False
    timeout_seconds: float = Field(600.0, gt=0, description="collective timeout: a hung peer ends the job")

    @model_validator(mode="after")
    def _mesh(self) -> ParallelSection:
        problems = section_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self


class CheckpointSection(StrictModel):
    every: int = Field(0, ge=0, description="save every N steps (0: only the final one)")
    keep: int = Field(3, ge=1, description="committed checkpoints kept")
    resume: bool = Field(True, description="continue from the newest committed checkpoint in run_dir")
    async_save: bool = Field(True, description="write files in the background; the step waits only for staging")
    save_best: bool = Field(True, description="also checkpoint each new best val loss; retention keeps it")
    purge_requires_upload: bool = Field(False, description="retention deletes only checkpoints the store named "
                                        "by their UPLOADED marker holds (one HEAD of the manifest; set when "
                                        "the sidecar runs)")
    weights_every: int = Field(0, ge=0, description="also write a weights-only package (RUN_DIR/weights/step-N: "
                               "model.safetensors, config.json, tokenizer.json, meta.json) every N steps and at "
                               "the last step, for evaluation while training (0: off; lmforge.trainer."
                               "weights_checkpoint)")
    weights_every_minutes: float = Field(0.0, ge=0, description="also write a weights package when this many "
                                         "minutes have passed since the last one (0: off; rank 0's clock, "
                                         "decided on logged steps: log_every steps apart at most)")
    weights_keep: int = Field(3, ge=1, description="weights packages kept on the local volume (with "
                              "purge_requires_upload, also every one the store does not hold yet)")
    weights_from_full: bool = Field(True, description="a weights package due at a step that is also saved in full "
                                    "is consolidated from that checkpoint once committed (no second save); "
                                    "false: always a model-only save (deferred until the full one is written)")

    @property
    def weights_enabled(self) -> bool:
        return bool(self.weights_every or self.weights_every_minutes)


class PreflightSection(StrictModel):
    enabled: bool = Field(False, description="run the preflight checks before training starts")
    payload_mb: float = Field(16.0, gt=0, description="all-reduce payload per rank")
    iterations: int = Field(5, ge=1)
    slow_factor: float = Field(3.0, gt=1, description="a rank this many times slower than the median fails")
    min_bus_bandwidth_gbps: float = Field(0.0, ge=0, description="fail below this all-reduce bus bandwidth (0: off)")


class MetricsSection(StrictModel):
    port: int = Field(0, ge=0, le=65535, description="Prometheus /metrics on rank 0 (0: off)")
    peak_flops: float | None = Field(None, gt=0, description="per-device peak FLOP/s for MFU (default: detected)")


class TrackingSection(StrictModel):
    mlflow_tracking_uri: str | None = Field(None, description="enable MLflow, e.g. http://mlflow:5000 or file:///x")
    mlflow_experiment: str = "lmforge"
    wandb_project: str | None = Field(None, description="enable Weights & Biases")
    wandb_mode: Literal["online", "offline"] = "online"
    run_name: str | None = Field(None, description="default: the run directory's name")


class Float8Section(StrictModel):
    """torchao's float8 training (torchao.float8, as torchtitan's `float8` converter applies it)."""

    enabled: bool = Field(False, description="convert the blocks' Linear layers to torchao Float8Linear "
                          "(convert_to_float8_training) before TP/FSDP; the output head and any Linear whose "
                          "dimensions are not multiples of 16 stay in bf16. Needs CUDA compute capability >= 8.9 "
                          "(H100, H200, L4, L40S, …; refused at start on older GPUs); also runs on CPU")
    recipe: Literal["tensorwise", "rowwise"] = Field("tensorwise", description="torchao's scaling recipe "
                                                     "(Float8LinearConfig.from_recipe_name): one scale per tensor "
                                                     "(fastest) or per row (more accurate; torchtitan's "
                                                     "`recipe_name`)")
    fsdp_float8_all_gather: bool = Field(True, description="tensorwise + FSDP/HSDP: all-gather the sharded "
                                         "weights in float8 (half bf16's bytes) and precompute their scales "
                                         "after each optimizer step (torchtitan's "
                                         "enable_fsdp_float8_all_gather, precompute_float8_dynamic_scale_for_fsdp)")


class ProfileSection(StrictModel):
    """torch.profiler traces of chosen steps (lmforge.trainer.profiling)."""

    steps: list[int] = Field(default_factory=list, description="steps to profile; each "
                                                     "rank writes DIR/step-NNNNN/rank-R.pt.trace.json (Chrome "
                                                     "trace: Perfetto, chrome://tracing, TensorBoard's profiler "
                                                     "plugin with --logdir DIR) and rank 0 a metrics.jsonl "
                                                     "'profile' record: time per kind of collective, exposed "
                                                     "communication")
    dir: str = Field("profile", description="the traces' directory, relative to run_dir")
    record_shapes: bool = Field(False, description="record operator input shapes (larger traces)")

    @model_validator(mode="after")
    def _steps(self) -> ProfileSection:
        if any(step < 0 for step in self.steps):
            raise ValueError(f"profile.steps are step numbers (0 or more): {self.steps}")
        return self


class TrainConfig(StrictModel):
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection
    optim: OptimSection = Field(default_factory=OptimSection)
    parallel: ParallelSection = Field(default_factory=ParallelSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    preflight: PreflightSection = Field(default_factory=PreflightSection)
    metrics: MetricsSection = Field(default_factory=MetricsSection)
    tracking: TrackingSection = Field(default_factory=TrackingSection)
    float8: Float8Section = Field(default_factory=Float8Section)
    profile: ProfileSection = Field(default_factory=ProfileSection)
    schedule: list[StageSection] = Field(default_factory=list, description="the recipe's stages by consumed "
                                         "tokens: global batch, sequence length, mixture, RoPE, document masking "
                                         "(lmforge.trainer.schedule); empty: one stage from data, grad_accum and "
                                         "the world size")
    steps: int = Field(100, ge=1)
    grad_accum: int = Field(1, ge=1, description="micro-batches per step (without a schedule; a schedule derives "
                                     "them from global_batch_tokens)")
    seed: int = 1234
    run_dir: str = "runs/default"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    log_every: int = Field(1, ge=1)
    eval_every: int = Field(0, ge=0, description="evaluate on the val shards every N steps (0: never)")
    eval_batches: int = Field(4, ge=1, description="val batches per evaluation (the same ones every time)")
    max_nonfinite_steps: int = Field(5, ge=1, description="stop after this many non-finite steps in a row")

    @model_validator(mode="after")
    def _checks(self) -> TrainConfig:
        if not self.model.init_from:  # (init_from's shape is the package's, checked when the run starts)
            self.model.build()  # an invalid model shape fails here, naming the field
        return self


def load_train_config(path: str | None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    return load_config(TrainConfig, path, overrides, env_prefix=ENV_PREFIX)
