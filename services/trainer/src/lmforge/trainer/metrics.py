"""Training telemetry: the per-step figures (MFU, memory, state bytes) and the Prometheus
endpoint on rank 0 (docs/design.md names); metrics.jsonl is metrics_file's."""

from __future__ import annotations

import resource

import torch
from prometheus_client import Counter, Gauge

from lmforge.common.metrics import AbsentUntilSetGauge, new_registry, serve_metrics
from lmforge.trainer.planner.hardware import GPUS


def device_peak_flops(device: torch.device, configured: float | None) -> float | None:
    """The configured peak, else the datasheet figure for a known GPU, else None (no MFU)."""
    if configured is not None:
        return configured
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    # the planner's table (dense bf16); an H100 PCIe reports "H100 PCIe": set metrics.peak_flops for it
    return next((gpu.peak_bf16_flops for key, gpu in GPUS.items() if key in name), None)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated device memory on GPU; peak resident set size of the process on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor's shard on this rank
    return local.numel() * local.element_size()


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds in parameters, gradients and optimizer state (after a step)."""
    params = list(model.parameters())
    optim = sum(_local_bytes(v) for state in optimizer.state.values() for v in state.values()
                if isinstance(v, torch.Tensor))
    sizes = {"params": sum(_local_bytes(p) for p in params),
             "grads": sum(_local_bytes(p.grad) for p in params if p.grad is not None),
             "optimizer": optim}
    return {**sizes, "total": sum(sizes.values())}


class TrainMetrics:
    """The trainer's Prometheus metrics, served by rank 0; per-rank gauges carry `rank`. Each
    gauge is absent until this process has its value (the first logged step, the first
    evaluation, the first save; MFU only with a known peak), so a restart or a slow restore
    shows a gap, not zeros that pull down averages and fire the loss-spike alert."""

    def __init__(self):
        self.registry = new_registry()
        r = self.registry
        self.step = AbsentUntilSetGauge("lmforge_train_step", "Last completed optimizer step", r)
        self.loss = AbsentUntilSetGauge("lmforge_train_loss", "Training loss (mean over ranks)", r)
        self.val_loss = AbsentUntilSetGauge("lmforge_train_val_loss", "Validation loss at the last evaluation", r)
        self.source_val_loss = Gauge("lmforge_train_source_val_loss", "Validation loss of each data source at the "
                                     "last evaluation (runs of several sources)", ["source"], registry=r)
        self.stage = AbsentUntilSetGauge("lmforge_train_stage", "The schedule's stage of the last step (0: first)", r)
        self.consumed_tokens = AbsentUntilSetGauge("lmforge_train_consumed_tokens",
                                                   "Tokens consumed by the end of the last step", r)
        self.grad_norm = AbsentUntilSetGauge("lmforge_train_grad_norm", "Global gradient norm before clipping", r)
        self.learning_rate = AbsentUntilSetGauge("lmforge_train_learning_rate", "Learning rate", r)
        self.tokens_per_second = AbsentUntilSetGauge("lmforge_train_tokens_per_second",
                                                     "Tokens per second, all ranks", r)
        self.mfu = AbsentUntilSetGauge("lmforge_train_mfu_ratio", "Model FLOPs utilization per device", r)
        self.step_seconds = Gauge("lmforge_train_step_seconds", "Step wall time", ["rank"], registry=r)
        self.data_wait = Gauge("lmforge_train_data_wait_seconds", "Time the step waited for data", ["rank"],
                               registry=r)
        self.peak_memory = Gauge("lmforge_train_peak_memory_bytes", "Peak device memory (RSS on CPU)", ["rank"],
                                 registry=r)
        self.nonfinite = Counter("lmforge_train_nonfinite_steps", "Steps skipped for a non-finite loss or gradient",
                                 registry=r)
        self.last_checkpoint = AbsentUntilSetGauge("lmforge_train_last_checkpoint_step",
                                                   "Step of the last committed checkpoint (-1: none yet)", r)
        self.checkpoint_stall = AbsentUntilSetGauge("lmforge_train_checkpoint_stall_seconds",
                                                    "Seconds the last checkpoint save blocked training", r)
        # Mixture-of-experts runs only: the step record's moe_* figures (mean over MoE layers and ranks).
        self.moe = {
            "moe_load_max_over_mean": AbsentUntilSetGauge(
                "lmforge_train_moe_load_max_over_mean", "MoE: busiest expert's assignments over the mean", r),
            "moe_dropped_fraction": AbsentUntilSetGauge(
                "lmforge_train_moe_dropped_fraction", "MoE: fraction of token-expert assignments dropped", r),
            "moe_balance_loss": AbsentUntilSetGauge(
                "lmforge_train_moe_balance_loss", "MoE: load-balancing loss before its coefficient (1: uniform)", r),
            "moe_z_loss": AbsentUntilSetGauge(
                "lmforge_train_moe_z_loss", "MoE: router z-loss before its coefficient", r),
        }
        self.server = None

    def serve(self, port: int) -> int:
        self.server = serve_metrics(self.registry, port)
        return self.server.server_port

    def observe_step(self, record: dict, per_rank: list[dict]) -> None:
        if self.last_checkpoint.value is None:
            # A resumed run reports its restored step before its first step, so none reported means none.
            self.last_checkpoint.set(-1)
        self.step.set(record["step"])
        self.loss.set(record["loss"])
        self.grad_norm.set(record["grad_norm"])
        self.learning_rate.set(record["lr"])
        self.tokens_per_second.set(record["tokens_per_second"])
        self.stage.set(record["stage"])
        self.consumed_tokens.set(record["tokens"])
        if record.get("mfu") is not None:
            self.mfu.set(record["mfu"])
        for key, gauge in self.moe.items():
            if record.get(key) is not None:
                gauge.set(record[key])
        for rank, figures in enumerate(per_rank):
            self.step_seconds.labels(rank=str(rank)).set(figures["step_seconds"])
            self.data_wait.labels(rank=str(rank)).set(figures["data_wait_seconds"])
            self.peak_memory.labels(rank=str(rank)).set(figures["peak_memory_bytes"])

    def observe_eval(self, val_loss: float, by_source: dict[str, float]) -> None:
        self.val_loss.set(val_loss)
        for source, loss in by_source.items():
            self.source_val_loss.labels(source=source).set(loss)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
