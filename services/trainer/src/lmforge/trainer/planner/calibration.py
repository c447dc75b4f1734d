"""The measured training runs the planner is calibrated on (calibration.json), the kernel-efficiency
fit to them (efficiency.py's constants), and the planner's prediction for each run.

calibration.json holds `records`, one per measured run; `excluded`, published runs the planner
cannot express, with the reason; and `fit`. A record is a run the planner can express: a model (a
preset and its overrides), the sequence length and global batch (sequences), a layout in the
trainer's axes with its micro-batching and activation checkpointing, a GPU of hardware.GPUS with
nodes × GPUs per node, precision bf16 or fp8 (Float8 linears, tensorwise scaling), the measured
tokens/s per GPU (with the MFU and step time where the source gives them), and its provenance:
source, date, device, and the command that ran it or the URL that publishes it. Loading refuses,
naming the record and the field, a record without provenance and one the planner cannot express
(an unknown preset or GPU, a layout that does not multiply to the GPUs or the batch).

The fit minimises Σ log²(predicted / measured tokens/s) over the records, each prediction the
planner's own (timing.step_time at the record's layout, with comm's communication for it), by a
pattern search over (peak_share, width_scale, float8_break_even) in log space from a fixed start,
so the same records always give the same fit. The band is the smallest and largest measured /
predicted ratio (1 when every prediction errs the same way).

    python -m lmforge.trainer.planner.calibration            each record: predicted against measured
    python -m lmforge.trainer.planner.calibration --refit    refit, write the fit into the file, print

bench/record_calibration.py adds `make bench-gpu`'s runs to the file and refits.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmforge.common.errors import CLI_ERRORS, ConfigError, as_lmforge_error
from lmforge.model.config import GPTConfig
from lmforge.trainer.planner.comm import AxisComm, communication
from lmforge.trainer.planner.efficiency import CALIBRATION_FILE, KernelEfficiency, calibrated, read_calibration
from lmforge.trainer.planner.hardware import Cluster, gpu_named
from lmforge.trainer.planner.layout import AXES, Layout
from lmforge.trainer.planner.search import PlanRequest, evaluate
from lmforge.trainer.planner.shape import ModelShape
from lmforge.trainer.planner.timing import step_time

PROVENANCE_KEYS = ("source", "date", "device")
LAYOUT_KEYS = (*AXES, "micro_batch", "microbatches", "activation_checkpointing")
DATE = re.compile(r"^\d{4}-\d{2}(-\d{2})?$")  # a month is enough where the source gives no day
START = KernelEfficiency(peak_share=0.5, width_scale=10_000.0, float8_break_even=20_000.0)
SMALLEST_STEP = 1e-6  # the pattern search's last step, in log units


@dataclass(frozen=True)
class Record:
    id: str
    preset: str
    overrides: dict[str, Any]
    seq_len: int
    global_batch: int  # sequences per optimizer step
    layout: Layout
    gpu: str
    nodes: int
    gpus_per_node: int
    precision: str  # bf16 | fp8
    tokens_per_second_per_gpu: float
    mfu: float | None  # measured, against the bf16 peak, where the source gives it
    provenance: dict[str, str]

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def provenance_problems(raw: dict) -> list[str]:
    """What a record's provenance lacks (empty when it has source, date, device and a command or URL)."""
    provenance = raw.get("provenance")
    if not isinstance(provenance, dict):
        return ["no provenance object"]
    problems = [f"provenance.{key} is missing" for key in PROVENANCE_KEYS if not provenance.get(key)]
    if not (provenance.get("command") or provenance.get("url")):
        problems.append("provenance has neither a command nor a url")
    if provenance.get("date") and not DATE.match(str(provenance["date"])):
        problems.append(f"provenance.date {provenance['date']!r} is not YYYY-MM-DD (or YYYY-MM)")
    return problems


def _get(raw: dict, path: str, kind: type | tuple[type, ...], where: str):
    value: Any = raw
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise ConfigError(f"{where}: {path} is missing")
        value = value[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind in (int, float, (int, float)):
        raise ConfigError(f"{where}: {path} must be {getattr(kind, '__name__', 'a number')}, got {value!r}")
    return value


def parse_record(raw: dict, where: str) -> Record:
    """One record of the file, checked; ConfigError names the record and what is wrong with it."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a record must be an object, got {type(raw).__name__}")
    where = f"{where} ({raw.get('id', 'no id')})"
    if problems := provenance_problems(raw):
        raise ConfigError(f"{where}: {'; '.join(problems)}")
    layout_raw = _get(raw, "layout", dict, where)
    missing = [key for key in LAYOUT_KEYS if key not in layout_raw]
    if missing:
        raise ConfigError(f"{where}: layout lacks {', '.join(missing)}")
    for key in LAYOUT_KEYS[:-1]:
        if _get(raw, f"layout.{key}", int, where) < 1:
            raise ConfigError(f"{where}: layout.{key} must be at least 1, got {layout_raw[key]}")
    _get(raw, "layout.activation_checkpointing", bool, where)
    layout = Layout(**{key: layout_raw[key] for key in LAYOUT_KEYS})
    precision = _get(raw, "precision", str, where)
    if precision not in ("bf16", "fp8"):
        raise ConfigError(f"{where}: precision must be bf16 or fp8 (the planner plans no other), got {precision!r}")
    tokens = _get(raw, "measured.tokens_per_second_per_gpu", (int, float), where)
    if tokens <= 0:
        raise ConfigError(f"{where}: measured.tokens_per_second_per_gpu must be positive, got {tokens}")
    record = Record(
        id=_get(raw, "id", str, where),
        preset=_get(raw, "model.preset", str, where),
        overrides=raw["model"].get("overrides") or {},
        seq_len=_get(raw, "seq_len", int, where),
        global_batch=_get(raw, "global_batch", int, where),
        layout=layout,
        gpu=_get(raw, "cluster.gpu", str, where),
        nodes=_get(raw, "cluster.nodes", int, where),
        gpus_per_node=_get(raw, "cluster.gpus_per_node", int, where),
        precision=precision,
        tokens_per_second_per_gpu=float(tokens),
        mfu=raw["measured"].get("mfu"),
        provenance=raw["provenance"],
    )
    if layout.gpus != record.gpus:
        raise ConfigError(f"{where}: the layout spans {layout.gpus} GPUs, the cluster has {record.gpus}")
    if layout.dp * layout.micro_batch * layout.microbatches != record.global_batch:
        raise ConfigError(
            f"{where}: dp {layout.dp} × micro_batch {layout.micro_batch} × microbatches {layout.microbatches} "
            f"is not the global batch {record.global_batch}"
        )
    return record


def read_document(path: Path = CALIBRATION_FILE) -> dict:
    document = read_calibration(path)
    if not isinstance(document.get("records"), list):
        raise ConfigError(f"{path}: no `records` list")
    return document


def parse_records(document: dict, where: str) -> list[Record]:
    records = [parse_record(raw, f"{where}: record {i}") for i, raw in enumerate(document["records"])]
    ids = [r.id for r in records]
    if duplicates := sorted({i for i in ids if ids.count(i) > 1}):
        raise ConfigError(f"{where}: record ids must be unique; repeated: {', '.join(duplicates)}")
    return records


def load_records(path: Path = CALIBRATION_FILE) -> list[Record]:
    return parse_records(read_document(path), str(path))


def plan_request(record: Record) -> PlanRequest:
    """The plan the record is a run of: its model, batch, cluster and precision, every axis pinned."""
    try:
        config = GPTConfig.preset(record.preset, **record.overrides)
    except ValueError as exc:  # pydantic's ValidationError
        raise ConfigError(f"record {record.id}: invalid model overrides: {exc}") from exc
    gpu = gpu_named(record.gpu)
    cluster = Cluster(gpu, record.nodes, record.gpus_per_node, gpu.nvlink_bytes_per_s, gpu.network_bits_per_s / 8)
    layout = record.layout
    return PlanRequest(
        shape=ModelShape.from_config(config),
        cluster=cluster,
        seq_len=record.seq_len,
        global_batch=record.global_batch,
        tokens=float(record.global_batch * record.seq_len),
        precision=record.precision,
        activation_checkpointing="on" if layout.activation_checkpointing else "off",
        pinned={**layout.axes(), "micro_batch": layout.micro_batch},
    )


def tokens_per_second_per_gpu(record: Record, step_seconds: float) -> float:
    return record.global_batch * record.seq_len / (record.gpus * step_seconds)


def planned_tokens_per_second(record: Record) -> float:
    """What the planner, as `lmforge-train plan` runs it, predicts for the record's run (tokens/s per GPU)."""
    return tokens_per_second_per_gpu(record, evaluate(plan_request(record), record.layout).time.step_seconds)


@dataclass(frozen=True)
class _Case:
    """A record's planner inputs, computed once for the fit's many predictions."""

    record: Record
    request: PlanRequest
    comm: dict[str, AxisComm]

    @classmethod
    def of(cls, record: Record) -> _Case:
        request = plan_request(record)
        comm = communication(
            request.shape, record.layout, request.seq_len, request.state, request.cluster, request.precision
        )
        return cls(record, request, comm)

    def predicted(self, efficiency: KernelEfficiency) -> float:
        request = self.request
        time = step_time(
            request.shape,
            self.record.layout,
            request.seq_len,
            request.global_batch,
            request.peak_flops,
            self.comm,
            precision=request.precision,
            efficiency=efficiency,
        )
        return tokens_per_second_per_gpu(self.record, time.step_seconds)


def _efficiency(x: list[float]) -> KernelEfficiency:
    return KernelEfficiency(*(math.exp(v) for v in x))


def fit(records: list[Record]) -> KernelEfficiency:
    """The least-squares constants (log residuals) and the band of measured / predicted ratios."""
    if not records:
        raise ConfigError("no calibration records to fit")
    cases = [_Case.of(r) for r in records]

    def loss(x: list[float]) -> float:
        efficiency = _efficiency(x)
        return sum(math.log(c.predicted(efficiency) / c.record.tokens_per_second_per_gpu) ** 2 for c in cases)

    x = [math.log(START.peak_share), math.log(START.width_scale), math.log(START.float8_break_even)]
    best, step = loss(x), 0.5
    while step > SMALLEST_STEP:
        for i, sign in itertools.product(range(len(x)), (1, -1)):
            trial = [v + sign * step * (j == i) for j, v in enumerate(x)]
            if (value := loss(trial)) < best:
                x, best = trial, value
                break
        else:
            step /= 2
    efficiency = _efficiency(x)
    ratios = [c.record.tokens_per_second_per_gpu / c.predicted(efficiency) for c in cases]
    return dataclasses.replace(efficiency, band=(min(*ratios, 1.0), max(*ratios, 1.0)))


def fit_document(efficiency: KernelEfficiency, records: list[Record]) -> dict:
    """The `fit` block: the constants (rounded to what the data can tell), how many records, and the residual."""
    cases = [_Case.of(r) for r in records]
    residuals = [math.log(c.predicted(efficiency) / c.record.tokens_per_second_per_gpu) for c in cases]
    return {
        "form": efficiency.as_dict()["form"],
        "peak_share": round(efficiency.peak_share, 4),
        "width_scale": round(efficiency.width_scale),
        "float8_break_even": round(efficiency.float8_break_even),
        "band": [round(v, 4) for v in efficiency.band],
        "records": len(records),
        "rms_log_residual": round(math.sqrt(sum(r * r for r in residuals) / len(residuals)), 4),
        "refit_with": "python -m lmforge.trainer.planner.calibration --refit",
    }


def write_document(document: dict, path: Path) -> None:
    """Atomically: a reader never sees half a file."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    temporary.replace(path)
    calibrated.cache_clear()


def refit(path: Path = CALIBRATION_FILE, document: dict | None = None) -> KernelEfficiency:
    """Fit the records (the file's, or `document`'s) and write them with the fit into the file."""
    document = read_document(path) if document is None else document
    records = parse_records(document, str(path))
    document["fit"] = fit_document(fit(records), records)
    write_document(document, path)
    return calibrated(path)


def comparison(records: list[Record], efficiency: KernelEfficiency) -> list[dict[str, Any]]:
    """Per record: measured and predicted tokens/s per GPU, their ratio, and both as MFU of the bf16
    peak (the trainer's convention, also for Float8 runs; the model FLOPs of flops_per_token)."""
    rows = []
    for case in (_Case.of(r) for r in records):
        record, request = case.record, case.request
        predicted = case.predicted(efficiency)
        flops = request.shape.flops_per_token(record.seq_len) / request.cluster.gpu.peak_bf16_flops
        layout = record.layout
        rows.append(
            {
                "id": record.id,
                "model": record.preset,
                "matmul_width": request.shape.matmul_width,
                "layout": layout.describe(),
                "gpus": f"{record.gpus} {record.gpu}",
                "precision": record.precision,
                "measured": record.tokens_per_second_per_gpu,
                "predicted": predicted,
                "predicted_over_measured": predicted / record.tokens_per_second_per_gpu,
                "measured_mfu": record.tokens_per_second_per_gpu * flops,
                "predicted_mfu": predicted * flops,
            }
        )
    return rows


def comparison_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| record | width | layout | GPUs | precision | measured tok/s/GPU | predicted | predicted / measured "
        "| MFU measured | MFU predicted |",
        "|---|---:|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['id']} | {row['matmul_width']:,.0f} | {row['layout']} | {row['gpus']} | {row['precision']} | "
            f"{row['measured']:,.1f} | {row['predicted']:,.1f} | {row['predicted_over_measured']:.3f} | "
            f"{row['measured_mfu']:.1%} | {row['predicted_mfu']:.1%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lmforge.trainer.planner.calibration",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--file", type=Path, default=CALIBRATION_FILE)
    parser.add_argument("--refit", action="store_true", help="refit the records and write the fit into the file")
    args = parser.parse_args(argv)
    try:
        efficiency = refit(args.file) if args.refit else calibrated(args.file)
        rows = comparison(load_records(args.file), efficiency)
    except CLI_ERRORS as exc:
        error = as_lmforge_error(exc)
        sys.stderr.write(f"{parser.prog}: error: {error}\n")
        return error.exit_code
    print(
        f"fit: efficiency = {efficiency.peak_share:.4f} · (1 − exp(−width / {efficiency.width_scale:,.0f})), "
        f"Float8 break-even width {efficiency.float8_break_even:,.0f}, band {efficiency.band[0]:.3f}–"
        f"{efficiency.band[1]:.3f} (measured / predicted)\n"
    )
    print(comparison_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
