"""The training loop: plain steps (nanoGPT's spirit), deterministic data, async checkpoints.

Model, parallelism, checkpointing and telemetry live in their own modules (torchtitan's
split); this file only sequences them.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from contextlib import nullcontext, suppress
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from lmforge.common.errors import LmforgeError
from lmforge.common.logging import get_logger
from lmforge.common.model import GPT, flops_per_token
from lmforge.trainer import faults
from lmforge.trainer.checkpoint import Checkpointer, best_checkpoint, load_latest
from lmforge.trainer.config import TrainConfig
from lmforge.trainer.data import MixtureSampler, ShardSource
from lmforge.trainer.data_sync import sync_sources
from lmforge.trainer.metrics import TrainMetrics, device_peak_flops, peak_memory_bytes, state_bytes
from lmforge.trainer.metrics_file import MetricsFile
from lmforge.trainer.optim import build_optimizer, learning_rate
from lmforge.trainer.parallel import Dist, all_reduce_mean, autocast_context, init_distributed, parallelize
from lmforge.trainer.prefetch import Prefetcher
from lmforge.trainer.preflight import run_preflight
from lmforge.trainer.report_html import ReportRefresher
from lmforge.trainer.tracking import open_trackers


class NonFiniteLossError(LmforgeError):
    exit_code = 5


def local_sources(config: TrainConfig, ctx: Dist) -> list[Path]:
    """The data-prep outputs as local directories (s3:// ones synced once per node)."""
    cache = Path(config.data.cache_dir or Path(config.run_dir) / "data-cache")
    uris = [s.path for s in config.data.sources]
    group = None
    if dist.is_initialized() and any(uri.startswith("s3://") for uri in uris):
        # The other ranks wait while local rank 0 downloads: longer than a collective may take.
        group = dist.new_group(backend="gloo", timeout=timedelta(hours=6))
    try:
        barrier = (lambda: dist.barrier(group=group)) if group is not None else (lambda: None)
        return sync_sources(uris, cache, local_rank=ctx.local_rank, barrier=barrier,
                            verify_sha256=config.data.verify_sha256)
    finally:
        if group is not None:
            dist.destroy_process_group(group)


def build_sampler(config: TrainConfig, paths: list[Path], split: str = "train") -> MixtureSampler:
    # Synced sources were checked against the manifest as they were downloaded.
    sources = [ShardSource(path, split, config.data.seq_len, name=Path(s.path.rstrip("/")).name,
                           verify_sha256=config.data.verify_sha256 and not s.path.startswith("s3://"))
               for path, s in zip(paths, config.data.sources, strict=True)]
    return MixtureSampler(sources, [s.weight for s in config.data.sources], config.seed)


@torch.no_grad()
def evaluate(model, sampler: MixtureSampler, config: TrainConfig, ctx: Dist) -> float:
    """Mean loss over the same eval_batches val batches every time (all ranks)."""
    model.eval()
    total = torch.zeros((), device=ctx.device)
    for index in range(config.eval_batches):
        tokens, _ = sampler.batch(index, ctx.rank, ctx.world_size, config.data.batch_size)
        batch = torch.from_numpy(tokens).to(ctx.device)
        with autocast_context(config.parallel, ctx):
            _, loss = model(batch[:, :-1], batch[:, 1:])
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


class Run:
    """What the loop logs to: JSON lines on every rank; metrics.jsonl (and report.html drawn
    from it), Prometheus and the experiment trackers on rank 0."""

    def __init__(self, config: TrainConfig, ctx: Dist):
        self.ctx = ctx
        self.log = get_logger("trainer", rank=ctx.rank)
        self.file = self.prometheus = self.trackers = self.report = None
        self.run_dir = Path(config.run_dir)
        self._checkpoint_step: int | None = None
        if not ctx.is_main:
            return
        run_dir = self.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(config.model_dump_json(indent=1))
        self.file = MetricsFile(run_dir / "metrics.jsonl")
        self.report = ReportRefresher(run_dir, self._report_not_written)
        self.prometheus = TrainMetrics()
        if config.metrics.port:
            port = self.prometheus.serve(config.metrics.port)
            self.log.info("metrics_serving", port=port)
        self.trackers = open_trackers(config.tracking, config.model_dump(mode="json"), run_dir)

    def record(self, kind: str, record: dict, *, console: bool = True) -> None:
        if console:
            self.log.info(kind, **record)
        if self.file:
            self.file.write({"kind": kind, **record})
        if self.trackers and kind in ("step", "eval"):
            self.trackers.log(record["step"], {k: v for k, v in record.items() if k != "step"})

    def start(self, resumed_from: int | None, steps: int) -> None:
        """The attempt's first record: the checkpoint it resumed from (None: from scratch)."""
        self._checkpoint_step = resumed_from
        if self.prometheus and resumed_from is not None:
            self.prometheus.last_checkpoint.set(resumed_from)
        if self.file:
            self.log.info("attempt_started", attempt=self.file.attempt, resumed_from=resumed_from)
        first = 0 if resumed_from is None else resumed_from + 1
        self.record("start", {"timestamp": time.time(), "resumed_from": resumed_from, "first_step": first,
                              "steps": steps, "world_size": self.ctx.world_size,
                              "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))},
                    console=False)

    def checkpoint_committed(self, step: int | None) -> None:
        """Called after every step with the newest committed step; records each commit once."""
        if step is None or step == self._checkpoint_step:
            return
        self._checkpoint_step = step
        if self.prometheus:
            self.prometheus.last_checkpoint.set(step)
        self.record("checkpoint", {"step": step, "timestamp": time.time()}, console=False)
        if self.report:
            self.report.request()  # a killed attempt leaves the report as of a recent checkpoint

    def _report_not_written(self, exc: Exception) -> None:  # training goes on regardless
        self.log.warning("report_not_written", path=str(self.run_dir / "report.html"),
                         error=f"{type(exc).__name__}: {exc}")

    def close(self, failed: bool) -> None:
        if self.trackers:
            self.trackers.close("FAILED" if failed else "FINISHED")
        if self.prometheus:
            self.prometheus.close()
        if self.file:
            try:
                self.record("end", {"timestamp": time.time(), "status": "failed" if failed else "finished"},
                            console=False)
            except OSError as exc:  # a full disk must not replace the error that ended the run
                self.log.warning("metrics_not_written", path=str(self.run_dir / "metrics.jsonl"), error=str(exc))
            with suppress(OSError):  # (the same failed write again; the file is closed all the same)
                self.file.close()
            self.report.close()


def train(config: TrainConfig) -> list[float]:
    """Train for config.steps; returns the per-step (all-rank mean) losses of this process's steps."""
    ctx = init_distributed(config.device, config.parallel)
    try:
        if config.preflight.enabled:
            run_preflight(ctx, config.preflight, timedelta(seconds=config.parallel.timeout_seconds))
        paths = local_sources(config, ctx)
        sampler = build_sampler(config, paths)  # bad data fails here, before the run directory is touched
        run, failed = Run(config, ctx), True
        try:
            losses = _train(config, ctx, run, paths, sampler)
            failed = False
            return losses
        finally:
            run.close(failed)
    finally:
        if ctx.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _train(config: TrainConfig, ctx: Dist, run: Run, paths: list[Path], sampler: MixtureSampler) -> list[float]:
    model_config = config.model.build(vocab_size=sampler.sources[0].vocab_size)
    torch.manual_seed(config.seed)  # same initial weights on every rank
    model = GPT(model_config).to(ctx.device)
    n_params = model.num_params()
    model = parallelize(model, config.parallel, ctx)
    optimizer = build_optimizer(model, config.optim, fused=ctx.device.type == "cuda")
    run.log.info("train_start", params=n_params, world_size=ctx.world_size, mode=config.parallel.mode,
                 device=str(ctx.device), model=model_config.model_dump())

    tokens_per_step = config.data.batch_size * config.data.seq_len * config.grad_accum * ctx.world_size
    flops_per_step = flops_per_token(model_config, config.data.seq_len) * tokens_per_step
    peak_flops = device_peak_flops(ctx.device, config.metrics.peak_flops)
    checkpoints = Path(config.run_dir) / "checkpoints"
    meta = {"config": config.model_dump(mode="json"), "tokenizer_sha256": sampler.sources[0].tokenizer_sha256,
            "world_size": ctx.world_size}
    checkpointer = Checkpointer(checkpoints, keep=config.checkpoint.keep, async_save=config.checkpoint.async_save,
                                timeout_seconds=config.parallel.timeout_seconds,
                                purge_requires_upload=config.checkpoint.purge_requires_upload)
    start_step, best_val, resumed_from = 0, math.inf, None
    if config.checkpoint.resume and (loaded := load_latest(checkpoints, model, optimizer)) is not None:
        resumed_from = loaded["step"]
        start_step = resumed_from + 1
        best = best_checkpoint(checkpoints)
        best_val = best["val_loss"] if best else math.inf
    run.start(resumed_from, config.steps)
    val_sampler = build_sampler(config, paths, "val") if config.eval_every else None

    delay = faults.data_delay(ctx.rank)

    def batch_fn(index: int):
        if delay:
            time.sleep(delay)
        return sampler.batch(index, ctx.rank, ctx.world_size, config.data.batch_size)

    prefetcher = Prefetcher(batch_fn, range(start_step * config.grad_accum, config.steps * config.grad_accum),
                            depth=config.data.prefetch, pin_memory=ctx.device.type == "cuda")
    batches = iter(prefetcher)
    mixture: Counter[int] = Counter()
    losses: list[float] = []
    nonfinite_in_a_row = 0
    memory_logged = False
    try:
        for step in range(start_step, config.steps):
            faults.maybe_inject(step, ctx.rank)
            started = time.perf_counter()
            lr = learning_rate(step, config.steps, config.optim)
            for group in optimizer.param_groups:
                group["lr"] = lr
            data_wait = 0.0
            step_loss = torch.zeros((), device=ctx.device)
            for micro in range(config.grad_accum):
                _, batch, refs, waited = next(batches)
                data_wait += waited
                mixture.update(ref.source for ref in refs)
                batch = batch.to(ctx.device, non_blocking=True)
                last = micro == config.grad_accum - 1
                sync = nullcontext() if last or config.parallel.mode != "ddp" else model.no_sync()
                with sync, autocast_context(config.parallel, ctx):
                    _, loss = model(batch[:, :-1], batch[:, 1:])
                    (loss / config.grad_accum).backward()
                step_loss += loss.detach() / config.grad_accum
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.optim.grad_clip)
            if hasattr(grad_norm, "full_tensor"):
                grad_norm = grad_norm.full_tensor()
            mean_loss = all_reduce_mean(step_loss, ctx).item()
            if not (math.isfinite(mean_loss) and math.isfinite(grad_norm.item())):
                optimizer.zero_grad(set_to_none=True)
                nonfinite_in_a_row += 1
                if run.prometheus:
                    run.prometheus.nonfinite.inc()
                run.log.warning("nonfinite_step_skipped", step=step, loss=mean_loss, in_a_row=nonfinite_in_a_row)
                if nonfinite_in_a_row >= config.max_nonfinite_steps:
                    raise NonFiniteLossError(f"{nonfinite_in_a_row} non-finite steps in a row at step {step}; stopping")
                continue
            nonfinite_in_a_row = 0
            optimizer.step()
            if not memory_logged:  # the optimizer state exists from the first step on
                run.record("memory", {"step": step, "rank": ctx.rank, **state_bytes(model, optimizer)})
                memory_logged = True
            optimizer.zero_grad(set_to_none=True)
            step_seconds = time.perf_counter() - started
            losses.append(mean_loss)
            if step % config.log_every == 0 or step == config.steps - 1:
                _log_step(run, ctx, step, mean_loss, grad_norm.item(), lr, step_seconds, data_wait,
                          tokens_per_step, flops_per_step, peak_flops, mixture, sampler)
            eval_now = val_sampler is not None and ((step + 1) % config.eval_every == 0 or step == config.steps - 1)
            val_loss, improved = None, False
            if eval_now:
                val_loss = evaluate(model, val_sampler, config, ctx)
                improved, best_val = val_loss < best_val, min(best_val, val_loss)
                run.record("eval", {"step": step, "val_loss": val_loss,
                                    "val_perplexity": math.exp(min(val_loss, 50.0)), "best_val_loss": best_val})
                if run.prometheus:
                    run.prometheus.val_loss.set(val_loss)
            periodic = config.checkpoint.every and (step + 1) % config.checkpoint.every == 0
            if step == config.steps - 1 or periodic or (improved and config.checkpoint.save_best):
                stall = checkpointer.save(step, model, optimizer, meta, val_loss=val_loss, is_best=improved)
                run.log.info("checkpoint_started", step=step, stall_seconds=round(stall, 4), best=improved)
                if run.prometheus:
                    run.prometheus.checkpoint_stall.set(stall)
            checkpointer.poll()
            run.checkpoint_committed(checkpointer.last_committed_step)
        checkpointer.close()
        run.checkpoint_committed(checkpointer.last_committed_step)
    finally:
        prefetcher.close()
    return losses


def _log_step(run: Run, ctx: Dist, step: int, loss: float, grad_norm: float, lr: float, step_seconds: float,
              data_wait: float, tokens_per_step: int, flops_per_step: float, peak_flops: float | None,
              mixture: Counter, sampler: MixtureSampler) -> None:
    counts = [float(mixture[i]) for i in range(len(sampler.sources))]
    per_rank = gather_rank_figures([step_seconds, data_wait, float(peak_memory_bytes(ctx.device)), *counts], ctx)
    if not ctx.is_main:
        return
    ranks = [{"step_seconds": r[0], "data_wait_seconds": r[1], "peak_memory_bytes": int(r[2])} for r in per_rank]
    totals = [sum(r[3 + i] for r in per_rank) for i in range(len(sampler.sources))]
    flops_per_second = flops_per_step / step_seconds
    record = {"step": step, "timestamp": time.time(), "loss": loss, "grad_norm": grad_norm, "lr": lr,
              "step_seconds": step_seconds, "data_wait_seconds": data_wait,
              "tokens_per_second": tokens_per_step / step_seconds,
              "flops_per_second": flops_per_second,
              "mfu": flops_per_second / ctx.world_size / peak_flops if peak_flops else None,
              "peak_memory_bytes": ranks[0]["peak_memory_bytes"],
              "mixture": {s.name: c / max(sum(totals), 1) for s, c in zip(sampler.sources, totals, strict=True)},
              "ranks": ranks}
    run.record("step", record)
    run.prometheus.observe_step(record, ranks)
