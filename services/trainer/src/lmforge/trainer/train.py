"""The training loop: plain steps (nanoGPT's spirit), deterministic data, async checkpoints.

`train(config)` runs one attempt: process group, preflight, data, run log, then a `Trainer`
(torchtitan's shape). Its __init__ builds the model, optimizer and checkpointer and resumes;
`train_step` is one optimizer step (forward/backward over the micro-batches, clip, step), the
one place a new kind of parallelism plugs in; `train` is the loop around it (logging, eval,
checkpoints). Model, parallelism, checkpointing and telemetry live in their own modules.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from lmforge.common.errors import ConfigError, LmforgeError
from lmforge.common.store import scheme_of
from lmforge.model.config import GPTConfig
from lmforge.model.document_mask import document_ids
from lmforge.model.moe import update_router_biases
from lmforge.model.rope import set_rope
from lmforge.model.transformer import GPT, flops_per_token, parameter_counts
from lmforge.trainer import faults
from lmforge.trainer.block_cache import BlockCache
from lmforge.trainer.config import TrainConfig
from lmforge.trainer.context_parallel import context_parallel_forward
from lmforge.trainer.data import SampleRef
from lmforge.trainer.data_stream import open_sources, read_batch
from lmforge.trainer.expert_parallel_layout import reduce_expert_gradients_then_clip
from lmforge.trainer.float8 import precompute_float8_scales, refuse_unsupported_float8
from lmforge.trainer.init_from import initial_weights, load_initial_state
from lmforge.trainer.layout_rules import MeshLayout, ModelDims, layout_problems, refuse
from lmforge.trainer.mesh_layout import trainer_layout
from lmforge.trainer.metrics import device_peak_flops, peak_memory_bytes, state_bytes
from lmforge.trainer.optim import build_optimizer, learning_rate
from lmforge.trainer.parallelize import Dist, all_reduce_mean, autocast_context, init_distributed, parallelize
from lmforge.trainer.pipeline_parallel import bubble_fraction
from lmforge.trainer.pipeline_parallel_training import (
    PipelineModel,
    build_pipeline_model,
    pipeline_microbatches,
)
from lmforge.trainer.prefetch import Prefetcher
from lmforge.trainer.preflight import run_preflight
from lmforge.trainer.profiling import StepProfiler
from lmforge.trainer.run_log import RunLog
from lmforge.trainer.sampling import BlockSampler, GlobalSampler, Sampler
from lmforge.trainer.schedule import Stage, TrainingPlan, resolve_stages, source_names
from lmforge.trainer.tensor_parallel import loss_context, replicated_value

# What the prefetcher yields: (batch index, tokens, where each sequence came from, seconds waited).
Batches = Iterator[tuple[int, torch.Tensor, list[SampleRef], float]]


class NonFiniteLossError(LmforgeError):
    exit_code = 5


class StageNeedsAnotherLayout(LmforgeError):
    """The schedule's next stage does not run on this layout: the run checkpointed the step before it and
    stopped, to be resumed on the stage's layout."""

    exit_code = 8


@dataclass(frozen=True)
class StepResult:
    """One optimizer step's figures; loss is the all-rank mean."""

    loss: float
    grad_norm: float
    lr: float
    data_wait: float


def node_cache(config: TrainConfig) -> BlockCache | None:
    """The node's block cache of s3:// sources (None when every source is local)."""
    if not any(scheme_of(s.path) == "s3" for s in config.data.sources):
        return None
    return BlockCache(Path(config.data.cache_dir or Path(config.run_dir) / "data-cache"), config.data.cache_bytes)


def build_sampler(config: TrainConfig, split: str = "train", cache: BlockCache | None = None, *,
                  plan: TrainingPlan | None = None, seq_len: int | None = None,
                  weights: list[float] | None = None, verify_sha256: bool | None = None) -> Sampler:
    """The training sampler (with `plan`: its stages' batches, mixtures and sequence lengths; the sources
    then hold the longest stage's sequences), or an evaluation sampler of seq_len-token sequences at
    `weights` (default: data.sources' weights) whose batch index is its step."""
    data = config.data
    seq_len = plan.seq_lens[1] if plan is not None else seq_len or data.seq_len
    sources = open_sources([s.path for s in data.sources], source_names(config), split, seq_len, cache=cache,
                           verify_sha256=data.verify_sha256 if verify_sha256 is None else verify_sha256)
    weights = weights or [s.weight for s in data.sources]
    if data.shuffle == "global":
        return GlobalSampler(sources, weights, config.seed, plan=plan)
    return BlockSampler(sources, weights, config.seed, streams=data.shuffle_streams,
                        window_blocks=data.shuffle_window_blocks, unit_blocks=data.shuffle_unit_blocks,
                        mixture_chunk=data.shuffle_mixture_chunk, plan=plan)


@torch.no_grad()
def evaluate(model, sampler: Sampler, config: TrainConfig, ctx: Dist, stage: Stage, eot_id: int | None) -> float:
    """Mean loss over the same eval_batches val batches every time (all ranks), at the stage's batch
    shape and attention (the sampler's sequences are the stage's)."""
    model.eval()
    total = torch.zeros((), device=ctx.device)
    batch_size = stage.batch_size * pipeline_microbatches(ctx.layout)
    for index in range(config.eval_batches):
        tokens, _ = read_batch(sampler, index, ctx.dp_rank, ctx.dp_size, batch_size)
        batch = torch.from_numpy(tokens).to(ctx.device)
        documents = document_ids(batch[:, :-1], eot_id) if stage.document_masking else None
        with autocast_context(config.parallel, ctx), loss_context(ctx.layout.tp):
            if isinstance(model, PipelineModel):
                loss = model.eval_loss(batch, documents=documents)
            elif ctx.cp_group is not None:  # this rank's shard of the sequences; the cp group's mean loss
                _, _, loss = context_parallel_forward(model, batch[:, :-1], batch[:, 1:], ctx.cp_group,
                                                      documents=documents)
                loss = replicated_value(loss)
            else:
                _, loss = model(batch[:, :-1], batch[:, 1:], documents=documents)
                loss = replicated_value(loss)
        total += loss.float() / config.eval_batches
    model.train()
    return all_reduce_mean(total, ctx).item()


def gather_rank_figures(figures: list[float], ctx: Dist) -> list[list[float]]:
    """Every rank's figures, on every rank (one small all-gather, on logged steps only)."""
    local = torch.tensor(figures, dtype=torch.float64, device=ctx.device)
    if ctx.world_size == 1:
        return [local.tolist()]
    gathered = [torch.empty_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, local)
    return [t.tolist() for t in gathered]


def train(config: TrainConfig) -> list[float]:
    """Train for config.steps; returns the per-step (all-rank mean) losses of this process's steps."""
    refuse_unsplittable_model(config)
    refuse_unsupported_float8(config)
    ctx = init_distributed(config.device, config.parallel, micro_batch=config.data.batch_size,
                           grad_accum=config.grad_accum)
    try:
        if config.preflight.enabled:
            run_preflight(ctx, config.preflight, timedelta(seconds=config.parallel.timeout_seconds))
        cache = node_cache(config)
        plan = TrainingPlan.of(config, ctx.dp_size, pipeline_microbatches(ctx.layout), ctx.layout.axes())
        # bad data fails here, before the run directory is touched
        sampler = build_sampler(config, cache=cache, plan=plan)
        refuse_masking_without_eot(plan, sampler)
        run, failed = RunLog(config, ctx), True
        try:
            losses = Trainer(config, ctx, run, cache, sampler, plan).train()
            failed = False
            return losses
        finally:
            run.close(failed)
    finally:
        if (ctx.world_size > 1 or ctx.mesh is not None or ctx.layout.mode == "ddp") and dist.is_initialized():
            dist.destroy_process_group()


def refuse_unsplittable_model(config: TrainConfig) -> None:
    """A layout the trainer does not run for this model (heads by tp, the sequence by 2·cp, …) fails before any
    process group work, naming the axis (init_from's shape and the data's vocabulary are checked when the model
    is built)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    layout = trainer_layout(config.parallel, world_size, micro_batch=config.data.batch_size,
                            grad_accum=config.grad_accum)
    model = None if config.model.init_from else ModelDims.of(config.model.build(), vocabulary=False)
    refuse_unrunnable_layout(layout, model, config, world_size)


def refuse_unrunnable_layout(layout: MeshLayout, model: ModelDims | None, config: TrainConfig, world_size: int) -> None:
    """ConfigError (one line, naming the axis) for the rulebook's first problem with this layout, model
    (None: not known yet) and run, at every sequence length of its schedule."""
    parallel = config.parallel
    for seq_len in sorted({stage.seq_len for stage in resolve_stages(config)}):
        refuse(layout_problems(layout, model, seq_len, world_size, pp_schedule=parallel.pp_schedule,
                               pp_virtual_stages=parallel.pp_virtual_stages, compiled=parallel.compile,
                               float8=config.float8.enabled))


def refuse_masking_without_eot(plan: TrainingPlan, sampler: Sampler) -> None:
    masked = [stage.name for stage in plan.stages if stage.document_masking]
    if masked and sampler.sources[0].eot_id is None:
        raise ConfigError(f"document masking ({', '.join(masked)}): the data's manifest names no end-of-text "
                          "token (tokenizer.eot_id), so documents cannot be told apart")


class Trainer:
    """One attempt at a run: resumes from the newest committed checkpoint when there is one and
    runs the steps from there to config.steps."""

    def __init__(self, config: TrainConfig, ctx: Dist, run: RunLog, cache: BlockCache | None,
                 sampler: Sampler, plan: TrainingPlan):
        self.config, self.ctx, self.run, self.sampler, self.plan = config, ctx, run, sampler, plan
        self.cache, self.eot_id = cache, sampler.sources[0].eot_id
        self.source_names = source_names(config)
        source = sampler.sources[0]
        self.initial_state = None  # model.init_from's weights, copied in before parallelize
        if config.model.init_from:
            model_config, self.initial_state = initial_weights(config.model, source.vocab_size, source.tokenizer_sha256)
        else:
            model_config = config.model.build(vocab_size=source.vocab_size)
        self.microbatches = pipeline_microbatches(ctx.layout)  # 1 without a pipeline
        self.pipeline_bubble = (
            {"pipeline_bubble": bubble_fraction(ctx.layout.pp, self.microbatches, config.parallel.pp_virtual_stages)}
            if ctx.layout.pp > 1 else {}
        )
        self.model, self.optimizer = self._build_model(model_config)

        self.model_config = model_config
        self.peak_flops = device_peak_flops(ctx.device, config.metrics.peak_flops)

        # imported here, not at the top: DCP's import (DTensor, ~0.5 s of CPU) is start-up that a rank refusing
        # its layout before any process group need not pay
        from lmforge.trainer.checkpoint import Checkpointer

        self.checkpoints = Path(config.run_dir) / "checkpoints"
        self.checkpoint_meta = {
            "config": config.model_dump(mode="json"),
            "tokenizer_sha256": sampler.sources[0].tokenizer_sha256,
            "world_size": ctx.world_size,
            "model_config": model_config.model_dump(mode="json"),  # export's shape (init_from's is not the preset's)
        }
        self.checkpointer = Checkpointer(
            self.checkpoints,
            keep=config.checkpoint.keep,
            async_save=config.checkpoint.async_save,
            timeout_seconds=config.parallel.timeout_seconds,
            purge_requires_upload=config.checkpoint.purge_requires_upload,
        )
        self.weights = None  # the weights-only packages (checkpoint.weights_every / weights_every_minutes)
        if config.checkpoint.weights_enabled:
            from lmforge.trainer.weights_checkpoint import WeightsSaver

            self.weights = WeightsSaver(Path(config.run_dir) / "weights", config, self.checkpointer,
                                        tokens_after=plan.tokens_after, record=run.record, agree=self._on_every_rank,
                                        tokenizer_sha256=source.tokenizer_sha256)
        self.weights_clock_due = False  # rank 0's clock says a package is due (shared on logged steps)
        self.first_step, self.best_val = self._resume()
        self.stage: Stage | None = None  # entered at the first step (train_step)
        self.val_samplers: dict[int, list[Sampler]] = {}  # by seq_len: the mixture's, then each source's

        self.mixture: Counter[int] = Counter()  # sequences drawn per source, this attempt
        self.nonfinite_in_a_row = 0
        self.memory_logged = False
        self.profiler = StepProfiler(config.profile, config.run_dir, ctx.rank, ctx.world_size, ctx.device, run.record)

    def _build_model(self, model_config: GPTConfig) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        ctx = self.ctx
        torch.manual_seed(self.config.seed)  # same initial weights on every rank
        model = GPT(model_config)
        if self.initial_state is not None:
            load_initial_state(model, self.initial_state)
            self.initial_state = None
        # again, with the vocabulary and model.init_from's shape known now
        refuse_unrunnable_layout(ctx.layout, ModelDims.of(model_config), self.config, ctx.world_size)
        model = model.to(ctx.device)
        self.moe_stats = model.moe_stats  # on the GPT itself: DDP and compile wrap it
        n_params = model.num_params()
        # An MoE's token uses top_k of the E experts: its active parameters, beside the total.
        active = {"active_params": parameter_counts(model_config)[1]} if model_config.moe is not None else {}
        if ctx.layout.pp > 1:  # split first, then the other axes per chunk (torchtitan's order)
            model = build_pipeline_model(model, self.config.parallel, ctx, self.plan.micro_batches(0),
                                         float8=self.config.float8)
        else:
            model = parallelize(model, self.config.parallel, ctx, float8=self.config.float8)
        optimizer = build_optimizer(model, self.config.optim, fused=ctx.device.type == "cuda")
        self.run.log.info(
            "train_start",
            params=n_params,
            **active,
            world_size=ctx.world_size,
            mode=ctx.layout.mode,
            mesh=ctx.layout.axes(),
            **self.pipeline_bubble,
            device=str(ctx.device),
            model=model_config.model_dump(),
        )
        return model, optimizer

    def _resume(self) -> tuple[int, float]:
        """Loads the newest committed checkpoint (if resuming) and records the attempt's start;
        returns the first step to run and the best val loss so far."""
        from lmforge.trainer.checkpoint import best_checkpoint, load_latest

        resumed_from, best_val = None, math.inf
        if self.config.checkpoint.resume:
            loaded = load_latest(self.checkpoints, self.model, self.optimizer)
            if loaded is not None:
                resumed_from = loaded["step"]
                best = best_checkpoint(self.checkpoints)
                best_val = best["val_loss"] if best else math.inf
        self.run.start(resumed_from, self.config.steps)
        return (0 if resumed_from is None else resumed_from + 1), best_val

    def train(self) -> list[float]:
        """Runs the steps; returns their all-rank mean losses (a skipped non-finite step has none)."""
        config = self.config
        losses: list[float] = []
        prefetcher = self._prefetcher()
        batches = iter(prefetcher)
        try:
            for step in range(self.first_step, config.steps):
                faults.maybe_inject(step, self.ctx.rank)
                started = time.perf_counter()
                with self.profiler.step(step):
                    result = self.train_step(step, batches)
                if result is None:  # skipped: no log, eval or checkpoint for this step
                    continue
                step_seconds = time.perf_counter() - started
                losses.append(result.loss)
                if step % config.log_every == 0 or step == config.steps - 1:
                    self._log_step(step, result, step_seconds)
                val_loss, improved = self._evaluate_if_due(step)
                self._checkpoint(step, val_loss, improved)
            if self.weights is not None:  # every package committed before the trainer exits
                self.weights.close(self.model, self.checkpoint_meta)
            self.checkpointer.close()
            self.run.checkpoint_committed(self.checkpointer.last_committed_step)
        finally:
            prefetcher.close()
        return losses

    def _prefetcher(self) -> Prefetcher:
        """Micro-batches from the first step's on, by batch index (the plan's: the micro-batches of the steps
        before, plus the micro-batch)."""
        config, ctx = self.config, self.ctx
        delay, slow_loader = faults.data_delay(ctx.rank), threading.Lock()

        def batch_fn(index: int):
            if delay:
                with slow_loader:  # one slow loader: batches loading at once do not share the delay
                    time.sleep(delay)
            step, _ = self.plan.locate(index)
            return read_batch(self.sampler, index, ctx.dp_rank, ctx.dp_size, self.plan.per_rank(step))

        indices = range(self.plan.batch_index(self.first_step), self.plan.batch_index(config.steps))
        return Prefetcher(batch_fn, indices, depth=config.data.prefetch, pin_memory=ctx.device.type == "cuda")

    def train_step(self, step: int, batches: Batches) -> StepResult | None:
        """One optimizer step over the next micro-batches (the plan's for the step): forward/backward,
        clip, step. None when the loss or gradient norm is not finite: the step is skipped."""
        stage = self.plan.stage(step)
        if stage is not self.stage:
            if (problem := self.plan.layout_problem(stage)) is not None:
                self._stop_before(stage, step, problem)
            self._enter_stage(stage, step)
        lr = learning_rate(step, self.plan, self.config.optim)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        data_wait = 0.0
        step_loss = torch.zeros((), device=self.ctx.device)
        micro_batches = self.plan.micro_batches(step)
        for micro in range(micro_batches):
            batch, waited = self._next_batch(batches)
            data_wait += waited
            step_loss += self.forward_backward(batch, last=micro == micro_batches - 1, micro_batches=micro_batches)
        if self.ctx.experts is not None:  # the expert gradients are reduced here, not by FSDP
            norm = reduce_expert_gradients_then_clip(self.model, self.ctx.experts, self.config.optim.grad_clip)
        elif isinstance(self.model, PipelineModel):  # the norm over every stage's parameters
            norm = self.model.clip_grad_norm(self.config.optim.grad_clip)
        else:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.optim.grad_clip)
        if hasattr(norm, "full_tensor"):  # a DTensor under FSDP: each rank holds its shards' part
            norm = norm.full_tensor()
        loss = all_reduce_mean(step_loss, self.ctx).item()
        grad_norm = norm.item()
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            self._skip_nonfinite(step, loss)
            return None
        self.nonfinite_in_a_row = 0
        self.optimizer.step()
        precompute_float8_scales(self.model, self.config.float8, self.ctx.layout.mode)
        update_router_biases(self.model)  # MoE with balancing=bias: this step's expert loads, summed over ranks
        if not self.memory_logged:  # the optimizer state exists from the first step on
            self._record_memory(step)
            self.memory_logged = True
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(loss=loss, grad_norm=grad_norm, lr=lr, data_wait=data_wait)

    def _record_memory(self, step: int) -> None:
        """Rank 0's state bytes, and every rank's under `ranks` (pipeline stages and expert shards differ;
        a collective: all ranks call it)."""
        mine = state_bytes(self.model, self.optimizer)
        ranks = gather_rank_figures([float(v) for v in mine.values()], self.ctx)
        if self.ctx.is_main:
            every = [{"rank": rank, **{key: int(v) for key, v in zip(mine, figures, strict=True)}}
                     for rank, figures in enumerate(ranks)]
            self.run.record("memory", {"step": step, "rank": 0, **mine, "ranks": every})

    def _next_batch(self, batches: Batches) -> tuple[torch.Tensor, float]:
        """The next micro-batch on the device, and the seconds spent waiting for it."""
        _, batch, refs, waited = next(batches)
        self.mixture.update(ref.source for ref in refs)
        return batch.to(self.ctx.device, non_blocking=True), waited

    def forward_backward(self, batch: torch.Tensor, *, last: bool, micro_batches: int) -> torch.Tensor:
        """One micro-batch's gradients, accumulated; returns its loss share (loss / micro_batches, detached).
        Under DDP the gradients are all-reduced on the step's last micro-batch only; a pipeline runs
        its schedule over the batch's pipeline micro-batches. With the stage's document masking a token
        attends only within its document."""
        documents = document_ids(batch[:, :-1], self.eot_id) if self.stage.document_masking else None
        if isinstance(self.model, PipelineModel):
            with autocast_context(self.config.parallel, self.ctx), loss_context(self.ctx.layout.tp):
                return self.model.train_step(batch, documents=documents) / micro_batches
        sync = nullcontext() if last or self.ctx.layout.mode != "ddp" else self.model.no_sync()
        with sync, autocast_context(self.config.parallel, self.ctx), loss_context(self.ctx.layout.tp):
            if self.ctx.cp_group is not None:
                # FSDP's reduce-scatter averages over dp_shard × cp: scaled by cp, the cp ranks' shares add up
                _, share, loss = context_parallel_forward(self.model, batch[:, :-1], batch[:, 1:], self.ctx.cp_group,
                                                          documents=documents)
                (share * (self.ctx.layout.cp / micro_batches)).backward()
            else:
                _, loss = self.model(batch[:, :-1], batch[:, 1:], documents=documents)
                (loss / micro_batches).backward()
        return replicated_value(loss.detach()) / micro_batches

    def _stop_before(self, stage: Stage, step: int, problem: str) -> None:
        """A stage this layout does not run: at the run's start a config error; later the step before it
        is checkpointed (committed) and the run stops, to resume on the stage's layout."""
        if self.stage is None:
            raise ConfigError(f"{problem}; run the stage on its own layout")
        self.checkpointer.wait()
        if self.weights is not None:
            self.weights.before_full_save()
        if self.checkpointer.last_committed_step != step - 1:
            self.checkpointer.save(step - 1, self.model, self.optimizer, self.checkpoint_meta)
        if self.weights is not None:
            self.weights.close(self.model, self.checkpoint_meta)
        self.checkpointer.close()
        self.run.checkpoint_committed(self.checkpointer.last_committed_step)
        raise StageNeedsAnotherLayout(f"stopped before step {step}: {problem}; resume the run on the stage's layout "
                                      f"(steps up to {step - 1} are checkpointed)")

    def _enter_stage(self, stage: Stage, step: int) -> None:
        """The stage's RoPE and, in a pipeline, its micro-batch count; recorded (rank 0) as a `stage` record."""
        micro_batches = self.plan.micro_batches(step)
        if isinstance(self.model, PipelineModel) and (self.stage or micro_batches != self.model.pipeline.grad_accum):
            self.model.set_grad_accum(micro_batches)  # (the pipeline was built for the first stage)
        self.stage = stage
        rope = set_rope(self.model, self.model_config, stage.rope_theta, stage.rope_scaling)
        self.checkpoint_meta["model_config"] = rope.model_dump(mode="json")  # an export takes the stage's RoPE
        self.run.record("stage", {"step": step, **stage.describe(self.source_names), "micro_batches": micro_batches})

    def _skip_nonfinite(self, step: int, loss: float) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.nonfinite_in_a_row += 1
        if self.run.prometheus:
            self.run.prometheus.nonfinite.inc()
        self.run.log.warning("nonfinite_step_skipped", step=step, loss=loss, in_a_row=self.nonfinite_in_a_row)
        if self.nonfinite_in_a_row >= self.config.max_nonfinite_steps:
            raise NonFiniteLossError(f"{self.nonfinite_in_a_row} non-finite steps in a row at step {step}; stopping")

    def _log_step(self, step: int, result: StepResult, step_seconds: float) -> None:
        """The step record (rank 0), with every rank's timings and memory (a collective: all ranks call it)."""
        ctx, sources = self.ctx, self.sampler.sources
        counts = [float(self.mixture[i]) for i in range(len(sources))]
        moe = self.moe_stats()  # the step's last micro-batch; {} for a dense model
        figures = [step_seconds, result.data_wait, float(peak_memory_bytes(ctx.device)), *counts, *moe.values()]
        if self.weights is not None and self.weights.every_minutes:  # rank 0's verdict reaches every rank with it
            figures.append(float(self.weights.clock_due(time.monotonic())))
        per_rank = gather_rank_figures(figures, ctx)
        if self.weights is not None and self.weights.every_minutes:
            self.weights_clock_due = per_rank[0][-1] > 0
        if not ctx.is_main:
            return
        ranks = [{"step_seconds": r[0], "data_wait_seconds": r[1], "peak_memory_bytes": int(r[2])} for r in per_rank]
        totals = [sum(r[3 + i] for r in per_rank) for i in range(len(sources))]
        first_moe = 3 + len(sources)
        moe_means = {f"moe_{key}": sum(r[first_moe + i] for r in per_rank) / len(per_rank) for i, key in enumerate(moe)}
        stage = self.plan.stage(step)
        tokens_per_step = stage.global_batch_tokens
        flops_per_second = flops_per_token(self.model_config, stage.seq_len) * tokens_per_step / step_seconds
        record = {
            "step": step,
            "timestamp": time.time(),
            "loss": result.loss,
            "grad_norm": result.grad_norm,
            "lr": result.lr,
            "stage": stage.index,
            "seq_len": stage.seq_len,
            "global_batch_tokens": tokens_per_step,
            "tokens": self.plan.tokens_after(step),  # consumed by the end of this step
            "step_seconds": step_seconds,
            "data_wait_seconds": result.data_wait,
            "tokens_per_second": tokens_per_step / step_seconds,
            "flops_per_second": flops_per_second,
            "mfu": flops_per_second / ctx.world_size / self.peak_flops if self.peak_flops else None,
            **self.pipeline_bubble,
            **moe_means,
            "peak_memory_bytes": ranks[0]["peak_memory_bytes"],
            "mixture": {s.name: c / max(sum(totals), 1) for s, c in zip(sources, totals, strict=True)},
            "ranks": ranks,
        }
        self.run.record("step", record)
        self.run.prometheus.observe_step(record, ranks)

    def _evaluate_if_due(self, step: int) -> tuple[float | None, bool]:
        """The val loss when an eval is due after `step` (every eval_every steps, and the last),
        and whether it is the best so far; (None, False) otherwise."""
        last = step == self.config.steps - 1
        if not self.config.eval_every or not ((step + 1) % self.config.eval_every == 0 or last):
            return None, False
        mixture, *by_source = self._val_samplers(self.stage.seq_len)
        val_loss = evaluate(self.model, mixture, self.config, self.ctx, self.stage, self.eot_id)
        source_losses = {name: evaluate(self.model, sampler, self.config, self.ctx, self.stage, self.eot_id)
                         for name, sampler in zip(self.source_names if by_source else [], by_source, strict=True)}
        improved, self.best_val = val_loss < self.best_val, min(self.best_val, val_loss)
        self.run.record(
            "eval",
            {
                "step": step,
                "val_loss": val_loss,
                "val_perplexity": math.exp(min(val_loss, 50.0)),
                "best_val_loss": self.best_val,
                "seq_len": self.stage.seq_len,
                **({"val_loss_by_source": source_losses} if source_losses else {}),
            },
        )
        if self.run.prometheus:
            self.run.prometheus.observe_eval(val_loss, source_losses)
        return val_loss, improved

    def _val_samplers(self, seq_len: int) -> list[Sampler]:
        """The val split at seq_len: the data.sources mixture's sampler, then (with several sources) one per
        source. The val shards are hashed the first time only."""
        if seq_len not in self.val_samplers:
            verify = None if not self.val_samplers else False
            sources = len(self.config.data.sources)
            weights = [[1.0 if i == j else 0.0 for j in range(sources)] for i in range(sources)] if sources > 1 else []
            self.val_samplers[seq_len] = [
                build_sampler(self.config, "val", self.cache, seq_len=seq_len, weights=w, verify_sha256=verify)
                for w in [None, *weights]]
        return self.val_samplers[seq_len]

    def _checkpoint(self, step: int, val_loss: float | None, improved: bool) -> None:
        """Starts a save when one is due (the last step, every checkpoint.every steps, a new best
        val loss), then records any save that has committed since."""
        config = self.config.checkpoint
        periodic = config.every and (step + 1) % config.every == 0
        full = step == self.config.steps - 1 or periodic or (improved and config.save_best)
        if full:
            if self.weights is not None:
                self.weights.before_full_save()  # a model-only save in flight shares the group: written first
            stall = self.checkpointer.save(
                step, self.model, self.optimizer, self.checkpoint_meta, val_loss=val_loss, is_best=improved
            )
            self.run.log.info("checkpoint_started", step=step, stall_seconds=round(stall, 4), best=improved)
            if self.run.prometheus:
                self.run.prometheus.checkpoint_stall.set(stall)
        self.checkpointer.poll()
        if self.weights is not None:
            due, self.weights_clock_due = self.weights.step_due(step) or self.weights_clock_due, False
            self.weights.after_step(step, self.model, self.checkpoint_meta, due=due, full_save_started=full,
                                    val_loss=val_loss)
        self.run.checkpoint_committed(self.checkpointer.last_committed_step)

    def _on_every_rank(self, flag: bool) -> bool:
        """Whether `flag` holds on every rank (one one-element all_reduce; the weights saver asks only on
        steps with a deferred package)."""
        if self.ctx.world_size == 1:
            return flag
        value = torch.tensor([1.0 if flag else 0.0], device=self.ctx.device)
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
        return bool(value.item())
