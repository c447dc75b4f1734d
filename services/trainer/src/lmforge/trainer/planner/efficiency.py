"""Kernel efficiency: the share of the dense bf16 peak a block's kernels reach when nothing waits on
communication, as a function of the block's matmul width, and Float8's speed-up on the linear layers.

    efficiency(w)     = peak_share · (1 − exp(−w / width_scale))
    float8_speedup(w) = 1 / (1/ρ + (1 − 1/ρ) · float8_break_even / w)

w is ModelShape.matmul_width, a block's matmul parameters per hidden unit (12·d for a GPT block,
14.5·d for llama-1b): the matmul FLOPs per element of a token's hidden state, against which the
element-wise work, the launches and the per-step work shrink. ρ is the FP8/BF16 peak ratio (2).

Why these forms. Efficiency rises with the width and saturates: the measured runs go from 32 % of
peak at w = 12,288 (350m, d = 1024) to 50 % at 29,696 (llama-1b) and stay near 50 % at 104,448
(llama-70b, TP 8). Of the saturating curves tried — w/(w + w0) (a fixed element-wise cost per
hidden unit), w²/(w² + w0²) and 1 − exp(−w/w0) — the first cannot rise that steeply and then
flatten (its worst record was off by 17 %); the other two fit equally (worst 12 %), and the
exponential is kept. Float8 halves the linears' matmul time but adds casts and scales that grow
with the activations, not with w: the linears' time becomes 1/ρ + c/w of bf16's, which is the form
above with float8_break_even the width where Float8 stops losing (c = (1 − 1/ρ)·break-even).
Attention, the output head and the element-wise work stay in bf16.

The constants are not chosen here: lmforge.trainer.planner.calibration fits them to the measured
runs in calibration.json and stores them in its `fit` block, which `calibrated()` reads. `band` is
the smallest and largest measured / predicted tokens/s over those runs; the planner's step-time
and MFU ranges scale the efficiency by it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from lmforge.common.errors import ConfigError

CALIBRATION_FILE = Path(__file__).with_name("calibration.json")
FORM = (
    "efficiency = peak_share * (1 - exp(-matmul_width / width_scale)); Float8 linears run "
    "1 / (1/r + (1 - 1/r) * float8_break_even / matmul_width) times faster (r = FP8/BF16 peak)"
)


@dataclass(frozen=True)
class KernelEfficiency:
    peak_share: float  # the share of the dense bf16 peak very wide blocks reach
    width_scale: float  # the matmul width at which 63 % of peak_share is reached
    float8_break_even: float  # the matmul width at which Float8 linears are as fast as bf16 ones
    band: tuple[float, float] = (1.0, 1.0)  # measured / predicted tokens/s, smallest and largest

    def __post_init__(self):
        for name in ("peak_share", "width_scale", "float8_break_even"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"kernel efficiency: {name} must be positive, got {getattr(self, name)}")
        if not 0 < self.band[0] <= self.band[1]:
            raise ConfigError(f"kernel efficiency: band must be two positive ratios, low first; got {self.band}")

    def at(self, matmul_width: float) -> float:
        return self.peak_share * (1 - math.exp(-matmul_width / self.width_scale))

    def float8_speedup(self, matmul_width: float, fp8_over_bf16: float = 2.0) -> float:
        return 1 / (1 / fp8_over_bf16 + (1 - 1 / fp8_over_bf16) * self.float8_break_even / matmul_width)

    def as_dict(self) -> dict:
        return {"form": FORM, **asdict(self), "band": list(self.band)}

    @classmethod
    def from_dict(cls, fit: dict, where: str) -> KernelEfficiency:
        missing = [key for key in ("peak_share", "width_scale", "float8_break_even", "band") if key not in fit]
        if missing:
            raise ConfigError(
                f"{where}: the fit lacks {', '.join(missing)}; refit it with "
                "`python -m lmforge.trainer.planner.calibration --refit`"
            )
        return cls(fit["peak_share"], fit["width_scale"], fit["float8_break_even"], tuple(fit["band"]))


def read_calibration(path: Path = CALIBRATION_FILE) -> dict:
    """The calibration file as a JSON object (its `records` and its `fit`)."""
    try:
        document = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the planner's calibration: {exc}") from exc
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: the planner's calibration is not a JSON object")
    return document


@lru_cache(maxsize=4)
def calibrated(path: Path = CALIBRATION_FILE) -> KernelEfficiency:
    """The fit stored in the calibration file (read once per path)."""
    document = read_calibration(path)
    if not isinstance(document.get("fit"), dict):
        raise ConfigError(f"{path}: no `fit` object; run `python -m lmforge.trainer.planner.calibration --refit`")
    return KernelEfficiency.from_dict(document["fit"], str(path))
