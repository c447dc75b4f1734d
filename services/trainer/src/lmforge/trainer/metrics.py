"""Training telemetry: the per-step figures (MFU, memory, state bytes), the Prometheus
endpoint on rank 0 (DESIGN.md names) and metrics.jsonl."""

from __future__ import annotations

import json
import resource
from pathlib import Path

import torch
from prometheus_client import Counter, Gauge

from lmforge.common.metrics import new_registry, serve_metrics

# Dense bf16 peak FLOP/s per device, from the vendors' datasheets (no sparsity).
PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,  # SXM; the PCIe part is lower, set metrics.peak_flops for it
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
    "L4": 121e12,
}


def device_peak_flops(device: torch.device, configured: float | None) -> float | None:
    """The configured peak, else the datasheet figure for a known GPU, else None (no MFU)."""
    if configured is not None:
        return configured
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_FLOPS.items() if key in name), None)


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


class TrainMetrics:
    """The trainer's Prometheus metrics, served by rank 0; per-rank gauges carry `rank`."""

    def __init__(self):
        self.registry = new_registry()
        r = self.registry
        self.step = Gauge("lmforge_train_step", "Last completed optimizer step", registry=r)
        self.loss = Gauge("lmforge_train_loss", "Training loss (mean over ranks)", registry=r)
        self.val_loss = Gauge("lmforge_train_val_loss", "Validation loss at the last evaluation", registry=r)
        self.grad_norm = Gauge("lmforge_train_grad_norm", "Global gradient norm before clipping", registry=r)
        self.learning_rate = Gauge("lmforge_train_learning_rate", "Learning rate", registry=r)
        self.tokens_per_second = Gauge("lmforge_train_tokens_per_second", "Tokens per second, all ranks",
                                       registry=r)
        self.mfu = Gauge("lmforge_train_mfu_ratio", "Model FLOPs utilization per device", registry=r)
        self.step_seconds = Gauge("lmforge_train_step_seconds", "Step wall time", ["rank"], registry=r)
        self.data_wait = Gauge("lmforge_train_data_wait_seconds", "Time the step waited for data", ["rank"],
                               registry=r)
        self.peak_memory = Gauge("lmforge_train_peak_memory_bytes", "Peak device memory (RSS on CPU)", ["rank"],
                                 registry=r)
        self.nonfinite = Counter("lmforge_train_nonfinite_steps", "Steps skipped for a non-finite loss or gradient",
                                 registry=r)
        self.last_checkpoint = Gauge("lmforge_train_last_checkpoint_step",
                                     "Step of the last committed checkpoint (-1: none yet)", registry=r)
        self.last_checkpoint.set(-1)
        self.checkpoint_stall = Gauge("lmforge_train_checkpoint_stall_seconds",
                                      "Seconds the last checkpoint save blocked training", registry=r)
        self.server = None

    def serve(self, port: int) -> int:
        self.server = serve_metrics(self.registry, port)
        return self.server.server_port

    def observe_step(self, record: dict, per_rank: list[dict]) -> None:
        self.step.set(record["step"])
        self.loss.set(record["loss"])
        self.grad_norm.set(record["grad_norm"])
        self.learning_rate.set(record["lr"])
        self.tokens_per_second.set(record["tokens_per_second"])
        if record.get("mfu") is not None:
            self.mfu.set(record["mfu"])
        for rank, figures in enumerate(per_rank):
            self.step_seconds.labels(rank=str(rank)).set(figures["step_seconds"])
            self.data_wait.labels(rank=str(rank)).set(figures["data_wait_seconds"])
            self.peak_memory.labels(rank=str(rank)).set(figures["peak_memory_bytes"])

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
