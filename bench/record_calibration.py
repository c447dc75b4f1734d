#!/usr/bin/env python3
"""Add the gpu suite's training runs to the planner's calibration records and refit its kernel efficiency.

    python bench/record_calibration.py bench/out/train-throughput-gpu.json [more results] [--calibration FILE]

`make bench-gpu` runs it after `bench/train_throughput.py --suite gpu`; for results that came back
from a lent device (bench/gpu/device_run.sh writes train-throughput-gpu*.json into $OUT) run it on
them here. Each row that finished becomes one record of
lmforge/trainer/planner/calibration.json (lmforge.trainer.planner.calibration says what a record
holds): the preset at the suite's sequence length, FSDP over the row's GPUs with its per-rank
batch, bf16 or Float8 (tensorwise), activation checkpointing as run, the measured tokens/s per GPU
and MFU, and as provenance the suite's date and command line, the device and the result file.
Rows the planner cannot express are left out, each with a line saying why: failed rows, fp32 rows,
Float8 recipes other than tensorwise, and results from a device the planner's GPU table does not
list (a CPU check of the code path, an H100 PCIe). A record with the same id (date, GPU, preset,
GPU count, precision, checkpointing) is replaced, so recording a result twice changes nothing.
Then the fit is redone and written, and each new record's prediction is printed beside its
measurement; one outside ±15 % is flagged (tests/trainer/test_planner_calibration.py fails on it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lmforge.common.errors import CLI_ERRORS, InputError, as_lmforge_error
from lmforge.trainer.planner.calibration import comparison, load_records, read_document, refit
from lmforge.trainer.planner.efficiency import CALIBRATION_FILE, calibrated
from lmforge.trainer.planner.hardware import gpu_for_device

TOLERANCE = 0.15


def record_id(date: str, gpu: str, row: dict) -> str:
    precision = f"float8-{row['float8']}" if row.get("float8") else "bf16"
    checkpointing = "-ac" if row.get("activation_checkpointing") else ""
    return f"{gpu.lower()}-{date}-{row['preset']}-{row['nproc']}gpu-{precision}{checkpointing}"


def skip_reason(row: dict) -> str | None:
    if "error" in row:
        return "the run failed"
    if not row.get("bf16"):
        return "fp32: the planner plans bf16 and fp8 only"
    if row.get("float8") not in (None, "tensorwise"):
        return f"Float8 recipe {row['float8']}: the planner's fp8 is tensorwise"
    return None


def records_from_result(result: dict, origin: str) -> tuple[list[dict], list[str]]:
    """The calibration records of one gpu-suite result, and a line for each row left out."""
    if result.get("suite") != "gpu":
        suite = result.get("suite")
        raise InputError(f"{origin}: not a gpu-suite result of bench/train_throughput.py (suite {suite!r})")
    missing = [key for key in ("device", "date", "command", "seq_len", "compile", "rows") if key not in result]
    if missing:
        raise InputError(f"{origin}: lacks {', '.join(missing)} (a result from before the suite recorded them)")
    gpu = gpu_for_device(result["device"])
    if gpu is None:
        return [], [f"{origin}: {result['device']!r} is no GPU of the planner's table: nothing recorded"]
    records, skipped = [], []
    for row in result["rows"]:
        name = f"{row.get('preset')} on {row.get('nproc')} GPU(s)"
        if reason := skip_reason(row):
            skipped.append(f"{origin}: {name} left out: {reason}")
            continue
        nproc, batch = row["nproc"], row["per_rank_batch"]
        records.append(
            {
                "id": record_id(result["date"], gpu.name, row),
                "model": {"preset": row["preset"], "overrides": {"context_length": result["seq_len"]}},
                "seq_len": result["seq_len"],
                "global_batch": batch * nproc,
                "layout": {"dp_replicate": 1, "dp_shard": nproc, "tp": 1, "pp": 1, "cp": 1, "ep": 1,
                           "micro_batch": batch, "microbatches": 1,
                           "activation_checkpointing": bool(row.get("activation_checkpointing"))},
                "cluster": {"gpu": gpu.name, "nodes": 1, "gpus_per_node": nproc},
                "precision": "fp8" if row.get("float8") else "bf16",
                "float8_recipe": row.get("float8"),
                "compile": bool(result["compile"]),
                "measured": {"tokens_per_second_per_gpu": row["tokens_per_second"] / nproc, "mfu": row.get("mfu"),
                             "step_seconds": row.get("step_seconds"),
                             "peak_memory_gib": round(row["peak_memory_bytes"] / 2**30, 1)
                             if row.get("peak_memory_bytes") else None},
                "provenance": {
                    "source": f"make bench-gpu: bench/train_throughput.py --suite gpu, {Path(origin).name}, "
                              "recorded by bench/record_calibration.py",
                    "date": result["date"],
                    "device": f"{result.get('gpus', nproc)} × {result['device']} ({result.get('machine', 'host n/a')})",
                    "command": result["command"],
                    "note": f"medians over steps {result.get('gpu_steps', 0) // 3}.. of {result.get('gpu_steps')}",
                },
            }
        )
    return records, skipped


def record(results: list[Path], calibration: Path) -> list[str]:
    """Adds the results' records (replacing same ids), refits; the ids added."""
    document = read_document(calibration)
    added: list[dict] = []
    for path in results:
        try:
            result = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: not JSON: {exc}") from exc
        records, skipped = records_from_result(result, str(path))
        for line in skipped:
            print(line, file=sys.stderr)
        added += records
    ids = {raw["id"] for raw in added}
    document["records"] = [r for r in document["records"] if r.get("id") not in ids] + added
    if added:  # every record checked and the fit redone before the file is written, once
        refit(calibration, document)
    return [raw["id"] for raw in added]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path, help="train-throughput-gpu*.json files")
    parser.add_argument("--calibration", type=Path, default=CALIBRATION_FILE)
    args = parser.parse_args(argv)
    try:
        ids = record(args.results, args.calibration)
        if not ids:
            print("no run to record")
            return 0
        rows = comparison([r for r in load_records(args.calibration) if r.id in ids], calibrated(args.calibration))
    except CLI_ERRORS as exc:
        error = as_lmforge_error(exc)
        print(f"record_calibration: error: {error}", file=sys.stderr)
        return error.exit_code
    print(f"recorded {len(ids)} run(s) in {args.calibration}, refitted")
    for row in rows:
        ratio = row["predicted_over_measured"]
        flag = "" if abs(ratio - 1) <= TOLERANCE else f"  OUTSIDE ±{TOLERANCE:.0%}"
        print(f"  {row['id']}: measured {row['measured']:,.0f} tokens/s per GPU, planner {row['predicted']:,.0f} "
              f"({ratio:.2f}×){flag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
