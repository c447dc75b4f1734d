"""The GPUs the planner knows, and the cluster a plan is for.

Peak FLOP/s are the vendors' dense figures (the datasheets print the 2:4-sparsity ones, twice as
large, with an asterisk). Memory is the datasheet's capacity in decimal GB, which is slightly
less than the devices expose (an H100 80GB shows 81,559 MiB = 85.5e9 bytes in nvidia-smi): the
planner errs on the safe side, and the headroom it keeps covers the CUDA context, NCCL buffers
and allocator fragmentation. Link rates are per GPU and per direction.

Sources:
  H100 SXM5  NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100): BF16
             1,979 TFLOPS*, FP8 3,958 TFLOPS* (*with sparsity), 80 GB HBM3, 3.35 TB/s, NVLink
             900 GB/s (bidirectional: 450 GB/s each way). DGX H100: 8 × ConnectX-7 400 Gb/s.
  H200 SXM   NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): same Hopper compute and
             NVLink as H100, 141 GB HBM3e, 4.8 TB/s. DGX H200: 8 × ConnectX-7 400 Gb/s.
  B200       NVIDIA HGX B200 (1,000 W) specifications (nvidia.com/en-us/data-center/hgx): per
             GPU FP16/BF16 4.5 PFLOPS*, FP8 9 PFLOPS*, 180 GB HBM3e (1.44 TB per 8-GPU board;
             the die carries 192 GB), 8 TB/s, NVLink 5 1.8 TB/s. DGX B200: 8 × ConnectX-7 400 Gb/s.
  A100 SXM4  NVIDIA A100 80GB datasheet (nvidia.com/en-us/data-center/a100): BF16 312 TFLOPS
             (624*), no FP8, 80 GB HBM2e, 2,039 GB/s, NVLink 600 GB/s. DGX A100: 8 × 200 Gb/s HDR.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmforge.common.errors import ConfigError

GB = 1e9
GIB = 2**30


@dataclass(frozen=True)
class GPU:
    name: str
    peak_bf16_flops: float  # dense, FLOP/s
    peak_fp8_flops: float | None  # dense, FLOP/s; None: no FP8 tensor cores
    memory_bytes: float
    nvlink_bytes_per_s: float  # per GPU, each direction
    network_bits_per_s: float  # the inter-node NIC per GPU in the vendor's reference system (DGX)
    source: str

    def peak_flops(self, precision: str) -> float:
        if precision == "bf16":
            return self.peak_bf16_flops
        if self.peak_fp8_flops is None:
            raise ConfigError(f"precision fp8: the {self.name} has no FP8 tensor cores; use --precision bf16")
        return self.peak_fp8_flops


GPUS: dict[str, GPU] = {
    gpu.name: gpu
    for gpu in (
        GPU("H100", 989e12, 1979e12, 80 * GB, 450 * GB, 400e9, "NVIDIA H100 Tensor Core GPU datasheet (SXM5)"),
        GPU("H200", 989e12, 1979e12, 141 * GB, 450 * GB, 400e9, "NVIDIA H200 datasheet (SXM)"),
        GPU("B200", 2250e12, 4500e12, 180 * GB, 900 * GB, 400e9, "NVIDIA HGX B200 specifications (1,000 W)"),
        GPU("A100", 312e12, None, 80 * GB, 300 * GB, 200e9, "NVIDIA A100 80GB datasheet (SXM4)"),
        # PCIe cards (no NVLink: the intra-node figure is PCIe Gen4 x16), for the trainer's MFU
        # more than for planning; L40S before L4, whose name it contains.
        GPU("L40S", 362e12, 733e12, 48 * GB, 32 * GB, 200e9, "NVIDIA L40S datasheet"),
        GPU("A10G", 125e12, None, 24 * GB, 32 * GB, 100e9, "AWS EC2 G5 (A10G) specifications"),
        GPU("L4", 121e12, 242e12, 24 * GB, 32 * GB, 100e9, "NVIDIA L4 datasheet"),
    )
}


def gpu_named(name: str) -> GPU:
    """The table's GPU, by name (case-insensitive)."""
    for key, gpu in GPUS.items():
        if key.lower() == name.lower():
            return gpu
    raise ConfigError(f"--gpu: unknown GPU type {name!r}; choose one of {', '.join(GPUS)}")


def gpu_for_device(device_name: str) -> GPU | None:
    """The table's GPU a CUDA device name (torch.cuda.get_device_name) is, or None: the first key the
    name contains (L40S before L4), except PCIe and NVL H100/H200s, whose peaks are lower than the
    SXM parts the table lists."""
    if any(variant in device_name.lower() for variant in ("pcie", "nvl")):
        return None
    return next((gpu for key, gpu in GPUS.items() if key in device_name), None)


@dataclass(frozen=True)
class Cluster:
    """Identical nodes of `gpus_per_node` GPUs joined by NVLink inside a node and by the network
    (InfiniBand / RoCE, one NIC per GPU) between nodes."""

    gpu: GPU
    nodes: int
    gpus_per_node: int
    nvlink_bytes_per_s: float
    network_bytes_per_s: float
    comm_efficiency: float = 0.8  # achieved collective bus bandwidth / link rate (nccl-tests reach ~0.8-0.9)
    usd_per_gpu_hour: float | None = None
    peak_flops_override: float | None = None

    def __post_init__(self):
        for name in ("nodes", "gpus_per_node"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        for name in ("nvlink_bytes_per_s", "network_bytes_per_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}: a bandwidth must be positive, got {getattr(self, name)}")
        if not 0 < self.comm_efficiency <= 1:
            raise ConfigError(f"--comm-efficiency must be in (0, 1], got {self.comm_efficiency}")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def peak_flops(self, precision: str) -> float:
        return self.peak_flops_override or self.gpu.peak_flops(precision)

    def link_bytes_per_s(self, inside_node: bool) -> float:
        """The bandwidth one GPU achieves in a collective over NVLink or over the network."""
        rate = self.nvlink_bytes_per_s if inside_node else self.network_bytes_per_s
        return rate * self.comm_efficiency
