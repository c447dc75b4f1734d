"""The training loop: one function, plain steps (nanoGPT's spirit), deterministic data."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from lmforge.common.errors import LmforgeError
from lmforge.common.logging import get_logger
from lmforge.common.model import GPT, flops_per_token
from lmforge.trainer import checkpoint
from lmforge.trainer.config import TrainConfig
from lmforge.trainer.data import MixtureSampler, ShardSource
from lmforge.trainer.optim import build_optimizer, learning_rate
from lmforge.trainer.parallel import all_reduce_mean, init_distributed, parallelize


class NonFiniteLossError(LmforgeError):
    exit_code = 5


def _maybe_inject_kill(step: int, rank: int) -> None:
    """Fault injection for the resume tests: LMFORGE_TRAINER_KILL_AT_STEP=N (and optionally
    LMFORGE_TRAINER_KILL_RANK=R) SIGKILLs this process when it reaches step N, on the first
    attempt only, so a torchrun restart (TORCHELASTIC_RESTART_COUNT > 0) runs clean."""
    target = os.environ.get("LMFORGE_TRAINER_KILL_AT_STEP")
    if target is None or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return
    if step == int(target) and rank == int(os.environ.get("LMFORGE_TRAINER_KILL_RANK", rank)):
        os.kill(os.getpid(), signal.SIGKILL)


class MetricsFile:
    """metrics.jsonl in the run directory (rank 0), one object per logged step."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, record: dict) -> None:
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def build_sampler(config: TrainConfig, split: str = "train") -> MixtureSampler:
    sources = [ShardSource(s.path, split, config.data.seq_len, verify_sha256=config.data.verify_sha256)
               for s in config.data.sources]
    return MixtureSampler(sources, [s.weight for s in config.data.sources], config.seed)


@torch.no_grad()
def evaluate(model, sampler: MixtureSampler, config: TrainConfig, ctx) -> float:
    """Mean loss over the same eval_batches val batches every time (all ranks)."""
    model.eval()
    total = torch.zeros((), device=ctx.device)
    for index in range(config.eval_batches):
        tokens, _ = sampler.batch(index, ctx.rank, ctx.world_size, config.data.batch_size)
        batch = torch.from_numpy(tokens).to(ctx.device)
        _, loss = model(batch[:, :-1], batch[:, 1:])
        total += loss / config.eval_batches
    model.train()
    return all_reduce_mean(total, ctx).item()


def train(config: TrainConfig) -> list[float]:
    """Train for config.steps; returns the per-step (all-rank mean) losses."""
    ctx = init_distributed(config.device, config.parallel)
    log = get_logger("trainer", rank=ctx.rank)
    sampler = build_sampler(config)
    model_config = config.model.build(vocab_size=sampler.sources[0].vocab_size)
    torch.manual_seed(config.seed)  # same initial weights on every rank
    model = GPT(model_config).to(ctx.device)
    n_params = model.num_params()
    model = parallelize(model, config.parallel, ctx)
    optimizer = build_optimizer(model, config.optim, fused=ctx.device.type == "cuda")
    run_dir = Path(config.run_dir)
    metrics = MetricsFile(run_dir / "metrics.jsonl") if ctx.is_main else None
    if ctx.is_main:
        (run_dir / "config.json").write_text(config.model_dump_json(indent=1))
        log.info("train_start", params=n_params, world_size=ctx.world_size, mode=config.parallel.mode,
                 device=str(ctx.device), model=model_config.model_dump())
    tokens_per_step = config.data.batch_size * config.data.seq_len * config.grad_accum * ctx.world_size
    flops_per_step = flops_per_token(model_config, config.data.seq_len) * tokens_per_step
    checkpoints = run_dir / "checkpoints"
    meta = {"config": config.model_dump(mode="json"), "tokenizer_sha256": sampler.sources[0].tokenizer_sha256,
            "world_size": ctx.world_size}
    start_step = 0
    if config.checkpoint.resume:
        loaded = checkpoint.load_latest(checkpoints, model, optimizer)
        start_step = 0 if loaded is None else loaded + 1
    val_sampler = build_sampler(config, "val") if config.eval_every else None
    best_val = math.inf
    losses: list[float] = []
    nonfinite_in_a_row = 0
    try:
        for step in range(start_step, config.steps):
            _maybe_inject_kill(step, ctx.rank)
            started = time.perf_counter()
            lr = learning_rate(step, config.steps, config.optim)
            for group in optimizer.param_groups:
                group["lr"] = lr
            data_wait = 0.0
            step_loss = torch.zeros((), device=ctx.device)
            for micro in range(config.grad_accum):
                tick = time.perf_counter()
                tokens, _ = sampler.batch(step * config.grad_accum + micro, ctx.rank, ctx.world_size,
                                          config.data.batch_size)
                batch = torch.from_numpy(tokens).to(ctx.device, non_blocking=True)
                data_wait += time.perf_counter() - tick
                last = micro == config.grad_accum - 1
                sync = nullcontext() if last or config.parallel.mode != "ddp" else model.no_sync()
                with sync:
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
                log.warning("nonfinite_step_skipped", step=step, loss=mean_loss, in_a_row=nonfinite_in_a_row)
                if nonfinite_in_a_row >= config.max_nonfinite_steps:
                    raise NonFiniteLossError(f"{nonfinite_in_a_row} non-finite steps in a row at step {step}; stopping")
                continue
            nonfinite_in_a_row = 0
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step_seconds = time.perf_counter() - started
            losses.append(mean_loss)
            if step % config.log_every == 0 or step == config.steps - 1:
                record = {"step": step, "loss": mean_loss, "grad_norm": grad_norm.item(), "lr": lr,
                          "step_seconds": step_seconds, "data_wait_seconds": data_wait,
                          "tokens_per_second": tokens_per_step / step_seconds,
                          "flops_per_second": flops_per_step / step_seconds}
                log.info("step", **record)
                if metrics:
                    metrics.write(record)
            if val_sampler is not None and ((step + 1) % config.eval_every == 0 or step == config.steps - 1):
                val_loss = evaluate(model, val_sampler, config, ctx)
                best_val = min(best_val, val_loss)
                record = {"step": step, "val_loss": val_loss, "val_perplexity": math.exp(min(val_loss, 50.0)),
                          "best_val_loss": best_val}
                log.info("eval", **record)
                if metrics:
                    metrics.write(record)
            last_step = step == config.steps - 1
            if last_step or (config.checkpoint.every and (step + 1) % config.checkpoint.every == 0):
                checkpoint.save(checkpoints, step, model, optimizer, meta, config.checkpoint.keep)
    finally:
        if metrics:
            metrics.close()
        if ctx.world_size > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return losses
