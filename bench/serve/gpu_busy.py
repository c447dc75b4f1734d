"""How busy a GPU was while something ran: NVML's utilization.gpu (the share of the last sample
period, 1/6 s to 1 s depending on the device, in which a kernel was running), sampled in a thread.

    with GpuBusy() as busy:
        run_load(...)
    busy.summary()  # {"source": "nvml", "samples": 93, "mean_pct": 87.2, "p50_pct": 91.0, ...}

The source is pynvml (nvidia-ml-py, a dependency of lmforge-inference) or, without it, a
`nvidia-smi --query-gpu=utilization.gpu -lms` child read line by line; with neither (no GPU, no
driver) the summary says so (source None) and nothing fails. `index` is NVML's device index,
which ignores CUDA_VISIBLE_DEVICES: 0 is the machine's first GPU, what a one-GPU server uses.
"""

from __future__ import annotations

import shutil
import subprocess
import threading

from loadgen import percentile

BUSY_PCT = 80  # "GPU busy >= 80%": the share of samples at or above it is reported


class GpuBusy:
    def __init__(self, index: int = 0, interval_s: float = 0.1):
        self.index, self.interval_s = index, interval_s
        self.samples: list[float] = []
        self.source: str | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._smi: subprocess.Popen | None = None

    def __enter__(self) -> GpuBusy:
        read = self._nvml() or self._nvidia_smi()
        if read is not None:
            self._thread = threading.Thread(target=read, name="gpu-busy", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._smi is not None:
            self._smi.terminate()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._smi is not None:
            self._smi.wait(timeout=5)

    def _nvml(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except Exception as exc:  # noqa: BLE001 - no library, no driver, no such device: try nvidia-smi
            self.error = f"nvml: {type(exc).__name__}: {exc}"
            return None
        self.source = "nvml"

        def read() -> None:
            try:
                while not self._stop.wait(self.interval_s):
                    self.samples.append(float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            finally:
                pynvml.nvmlShutdown()

        return read

    def _nvidia_smi(self):
        smi = shutil.which("nvidia-smi")
        if smi is None:
            self.error = (self.error or "") + "; no nvidia-smi"
            return None
        self._smi = subprocess.Popen([smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                      "-i", str(self.index), "-lms", str(max(1, int(self.interval_s * 1000)))],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.source = "nvidia-smi"

        def read() -> None:
            for line in self._smi.stdout:
                if line.strip().isdigit():
                    self.samples.append(float(line))

        return read

    def summary(self) -> dict:
        samples = self.samples
        return {"source": self.source, "samples": len(samples), "interval_s": self.interval_s,
                "mean_pct": sum(samples) / len(samples) if samples else None, "p50_pct": percentile(samples, 50),
                f"share_at_least_{BUSY_PCT}pct": (sum(s >= BUSY_PCT for s in samples) / len(samples)
                                                  if samples else None),
                **({"error": self.error} if not samples and self.error else {})}
