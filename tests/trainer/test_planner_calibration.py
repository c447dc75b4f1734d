"""The planner agrees with the measured runs (planner/calibration.json): every record's predicted
tokens/s per GPU within ±15 % of its measurement, every record with its provenance, the stored fit
the fit of the records, the plan's range the fit's band; and bench/record_calibration.py turning a
gpu-suite result into records (a fabricated one: no GPU needed)."""

from __future__ import annotations

import copy
import importlib.util
import json
import math

import pytest

from lmforge.common.errors import ConfigError
from lmforge.trainer.planner.calibration import fit as fit_records
from lmforge.trainer.planner.calibration import (
    load_records,
    main,
    planned_tokens_per_second,
    provenance_problems,
    read_document,
)
from lmforge.trainer.planner.efficiency import CALIBRATION_FILE, KernelEfficiency, calibrated
from lmforge.trainer.planner.hardware import Cluster, gpu_for_device, gpu_named
from lmforge.trainer.planner.layout import Layout
from lmforge.trainer.planner.search import PlanRequest, evaluate
from lmforge.trainer.planner.shape import ModelShape
from lmforge.trainer.planner.timing import FP8_OVER_BF16
from tests.conftest import REPO_ROOT

TOLERANCE = 0.15
RECORDS = load_records()


def one_gpu(gpu: str) -> Cluster:
    spec = gpu_named(gpu)
    return Cluster(spec, 1, 1, spec.nvlink_bytes_per_s, spec.network_bits_per_s / 8)


def shape_of(preset: str, **overrides) -> ModelShape:
    from lmforge.model.config import GPTConfig

    return ModelShape.from_config(GPTConfig.preset(preset, **overrides))


@pytest.mark.parametrize("record", RECORDS, ids=[r.id for r in RECORDS])
def test_the_planner_predicts_every_measured_run_within_15_percent(record):
    predicted = planned_tokens_per_second(record)
    ratio = predicted / record.tokens_per_second_per_gpu
    assert abs(ratio - 1) <= TOLERANCE, (
        f"{record.id}: planner {predicted:,.1f} tokens/s per GPU, measured {record.tokens_per_second_per_gpu:,.1f}"
    )


def test_the_records_span_both_ends_and_both_precisions():
    """What the ±15 % is worth: small and large blocks, one GPU and 256, bf16 and Float8, checkpointing."""
    widths = {shape_of(r.preset, **r.overrides).matmul_width for r in RECORDS}
    assert min(widths) <= 12_288 and max(widths) >= 100_000
    assert {r.precision for r in RECORDS} == {"bf16", "fp8"}
    assert {r.gpus for r in RECORDS} >= {1, 256}
    assert {r.layout.activation_checkpointing for r in RECORDS} == {False, True}


def test_every_record_has_its_provenance():
    for raw in read_document()["records"]:
        assert provenance_problems(raw) == [], raw["id"]
        provenance = raw["provenance"]
        url = provenance.get("url")
        assert url is None or url.startswith("https://"), raw["id"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p.pop("source"), "provenance.source is missing"),
        (lambda p: p.pop("date"), "provenance.date is missing"),
        (lambda p: p.update(date="June 2025"), "is not YYYY-MM-DD"),
        (lambda p: (p.pop("command", None), p.pop("url", None)), "neither a command nor a url"),
    ],
    ids=["no-source", "no-date", "bad-date", "no-command-or-url"],
)
def test_a_record_without_provenance_is_refused_naming_it(tmp_path, capsys, change, message):
    document = read_document()
    raw = document["records"][2]
    change(raw["provenance"])
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=message) as caught:
        load_records(path)
    assert raw["id"] in str(caught.value)
    assert main(["--file", str(path)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and raw["id"] in error and message in error


def test_a_record_the_planner_cannot_express_is_refused(tmp_path):
    document = read_document()
    document["records"][0]["layout"]["dp_shard"] = 2  # two data-parallel ranks on a one-GPU cluster
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match="spans 2 GPUs, the cluster has 1"):
        load_records(path)


def test_the_stored_fit_is_the_fit_of_the_records():
    """calibration.json's `fit` is what refitting its records gives: nobody edited one without the other."""
    assert _same_fit(calibrated(), fit_records(RECORDS))
    assert read_document()["fit"]["records"] == len(RECORDS)


def test_the_fit_is_deterministic_and_its_band_brackets_the_records():
    first, second = fit_records(RECORDS), fit_records(RECORDS)
    assert first == second
    low, high = first.band
    for record in RECORDS:
        ratio = record.tokens_per_second_per_gpu / planned_tokens_per_second(record)
        assert low - 1e-3 <= ratio <= high + 1e-3, record.id


def test_efficiency_saturates_in_the_matmul_width_and_float8_breaks_even_where_fitted():
    efficiency = calibrated()
    small, mid, large = (shape_of(p).matmul_width for p in ("350m", "llama-1b", "llama-70b"))
    assert small == 12 * 1024  # a GPT block: 4·d² attention + 8·d² MLP, per hidden unit
    assert efficiency.at(small) < efficiency.at(mid) < efficiency.at(large) < efficiency.peak_share
    assert efficiency.at(large) == pytest.approx(efficiency.peak_share, rel=0.01)
    assert efficiency.float8_speedup(efficiency.float8_break_even) == pytest.approx(1.0)
    assert efficiency.float8_speedup(small) < 1 < efficiency.float8_speedup(large) < FP8_OVER_BF16
    assert efficiency.float8_speedup(1e12) == pytest.approx(FP8_OVER_BF16, rel=1e-6)


def test_the_plan_range_is_the_fits_band_and_the_fp8_peak_is_twice_bf16s():
    """On one GPU nothing is communicated: the MFU range is the MFU times the band exactly."""
    request = PlanRequest(shape_of("llama-1b", context_length=1024), one_gpu("H200"), 1024, 16, 1e9)
    layout = Layout(1, 1, 1, 1, 1, 1, micro_batch=16, microbatches=1, activation_checkpointing=False)
    time = evaluate(request, layout).time
    low, high = calibrated().band
    assert time.mfu_range == pytest.approx((time.mfu * low, time.mfu * high))
    for gpu in ("H100", "H200", "B200", "L40S", "L4"):
        spec = gpu_named(gpu)
        assert spec.peak_fp8_flops / spec.peak_bf16_flops == pytest.approx(FP8_OVER_BF16, rel=0.02)


def test_a_json_plan_names_the_calibrated_efficiency(capsys):
    from lmforge.trainer.cli import main as trainer_cli

    code = trainer_cli([
        "plan", "--model", "350m", "--seq-len", "1024", "--gpu", "H200", "--nodes", "1", "--gpus-per-node", "1",
        "--global-batch-sequences", "16", "--micro-batch", "16", "--activation-checkpointing", "off",
        "--format", "json",
    ])  # fmt: skip
    assert code == 0
    plan = json.loads(capsys.readouterr().out)
    efficiency = plan["assumptions"]["compute_efficiency"]
    assert efficiency["matmul_width"] == 12_288
    assert efficiency["at_this_model"] == pytest.approx(calibrated().at(12_288))
    assert efficiency["band"] == pytest.approx(list(calibrated().band))
    record = next(r for r in RECORDS if r.id == "h200-2026-11-26-350m-bf16")
    assert plan["recommended"]["step"]["mfu"] == pytest.approx(record.mfu, rel=TOLERANCE)


def test_gpu_for_device_reads_cuda_device_names():
    assert gpu_for_device("NVIDIA H100 80GB HBM3").name == "H100"
    assert gpu_for_device("NVIDIA H200").name == "H200"
    assert gpu_for_device("NVIDIA L40S").name == "L40S"
    assert gpu_for_device("NVIDIA L4").name == "L4"
    for name in ("NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA A100-PCIE-40GB", "CPU (x86_64)"):
        assert gpu_for_device(name) is None, name


def test_a_broken_fit_block_is_refused(tmp_path):
    document = read_document()
    del document["fit"]["width_scale"]
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match="the fit lacks width_scale"):
        calibrated(path)
    with pytest.raises(ConfigError, match="band must be two positive ratios"):
        KernelEfficiency(0.5, 1e4, 2e4, band=(1.2, 0.9))


# --- bench/record_calibration.py on a fabricated gpu-suite result -------------------------------


def _recorder():
    spec = importlib.util.spec_from_file_location("record_calibration", REPO_ROOT / "bench" / "record_calibration.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(preset, tokens, *, nproc=1, batch=16, bf16=True, float8=None, ac=False, **extra):
    return {"nproc": nproc, "bf16": bf16, "per_rank_batch": batch, "float8": float8, "activation_checkpointing": ac,
            "tokens_per_second": tokens, "mfu": 0.4, "step_seconds": 16 * 1024 / tokens,
            "peak_memory_bytes": 40 * 2**30, "preset": preset, **extra}  # fmt: skip


def _result(device="NVIDIA H200", **changes):
    """What bench/train_throughput.py --suite gpu writes, with made-up figures."""
    result = {
        "suite": "gpu", "device": device, "gpus": 2, "presets": "llama-1b", "runs": "plain,fp32,float8,ac",
        "seq_len": 1024, "global_batch": 16, "compile": True, "gpu_steps": 60, "date": "2027-01-15",
        "command": "python3 bench/train_throughput.py --suite gpu --preset llama-1b", "machine": "x86_64 16 CPUs",
        "rows": [
            _row("llama-1b", 62_000.0),
            _row("llama-1b", 15_000.0, bf16=False),
            _row("llama-1b", 118_000.0, nproc=2, batch=8),
            _row("llama-1b", 67_000.0, float8="tensorwise"),
            _row("llama-1b", 60_000.0, float8="rowwise"),
            _row("llama-1b", 53_000.0, ac=True),
            {"nproc": 1, "bf16": True, "per_rank_batch": 16, "float8": None, "activation_checkpointing": False,
             "preset": "llama-350m", "error": "gpu run failed"},
        ],
    }  # fmt: skip
    result.update(changes)
    return result


def test_recording_a_gpu_result_adds_its_runs_with_provenance_and_refits(tmp_path, capsys):
    calibration = tmp_path / "calibration.json"
    calibration.write_bytes(CALIBRATION_FILE.read_bytes())
    result = tmp_path / "train-throughput-gpu.json"
    result.write_text(json.dumps(_result()))
    before = read_document(calibration)

    assert _recorder().main([str(result), "--calibration", str(calibration)]) == 0
    out, err = capsys.readouterr()
    after = read_document(calibration)
    new = {r["id"]: r for r in after["records"]}
    for old in before["records"]:
        assert new.pop(old["id"]) == old  # the earlier records are kept as they were
    assert sorted(new) == [
        "h200-2027-01-15-llama-1b-1gpu-bf16",
        "h200-2027-01-15-llama-1b-1gpu-bf16-ac",
        "h200-2027-01-15-llama-1b-1gpu-float8-tensorwise",
        "h200-2027-01-15-llama-1b-2gpu-bf16",
    ]
    two = new["h200-2027-01-15-llama-1b-2gpu-bf16"]
    assert two["measured"]["tokens_per_second_per_gpu"] == 59_000.0  # the suite's figure is all GPUs'
    assert (two["layout"]["dp_shard"], two["layout"]["micro_batch"], two["global_batch"]) == (2, 8, 16)
    assert new["h200-2027-01-15-llama-1b-1gpu-float8-tensorwise"]["precision"] == "fp8"
    assert new["h200-2027-01-15-llama-1b-1gpu-bf16-ac"]["layout"]["activation_checkpointing"] is True
    for raw in new.values():
        assert provenance_problems(raw) == []
        assert raw["provenance"]["date"] == "2027-01-15"
        assert raw["provenance"]["command"].startswith("python3 bench/train_throughput.py")
        assert "NVIDIA H200" in raw["provenance"]["device"]
        assert "train-throughput-gpu.json" in raw["provenance"]["source"]
    for reason in ("fp32", "rowwise", "the run failed"):
        assert reason in err
    assert after["fit"]["records"] == len(before["records"]) + 4
    assert after["fit"] != before["fit"]
    assert _same_fit(calibrated(calibration), fit_records(load_records(calibration)))
    assert "recorded 4 run(s)" in out and "h200-2027-01-15-llama-1b-2gpu-bf16" in out

    # recording the same result again changes nothing
    text = calibration.read_text()
    assert _recorder().main([str(result), "--calibration", str(calibration)]) == 0
    assert calibration.read_text() == text


def _same_fit(a: KernelEfficiency, b: KernelEfficiency) -> bool:
    constants = ("peak_share", "width_scale", "float8_break_even")
    return all(math.isclose(getattr(a, k), getattr(b, k), rel_tol=1e-3) for k in constants) and all(
        math.isclose(x, y, abs_tol=1e-3) for x, y in zip(a.band, b.band, strict=True)
    )


@pytest.mark.parametrize(
    ("result", "code", "message"),
    [
        (_result(device="CPU (x86_64)"), 0, "no GPU of the planner's table: nothing recorded"),
        (_result(device="NVIDIA H100 PCIe"), 0, "nothing recorded"),
        ({k: v for k, v in _result().items() if k != "date"}, 3, "lacks date"),
        (_result(suite="overhead"), 3, "not a gpu-suite result"),
    ],
    ids=["cpu", "h100-pcie", "no-date", "overhead-suite"],
)
def test_results_the_planner_cannot_use_record_nothing(tmp_path, capsys, result, code, message):
    calibration = tmp_path / "calibration.json"
    calibration.write_bytes(CALIBRATION_FILE.read_bytes())
    path = tmp_path / "result.json"
    path.write_text(json.dumps(copy.deepcopy(result)))
    assert _recorder().main([str(path), "--calibration", str(calibration)]) == code
    assert message in capsys.readouterr().err
    assert calibration.read_bytes() == CALIBRATION_FILE.read_bytes()


def test_the_make_target_records_the_gpu_suites_result():
    makefile = (REPO_ROOT / "Makefile").read_text()
    target = makefile[makefile.index("\nbench-gpu:") :].split("\n\n")[0]
    lines = [line.strip() for line in target.splitlines()[1:]]
    suite = lines.index("$(PY) bench/train_throughput.py --suite gpu")
    assert lines[suite + 1] == "$(PY) bench/record_calibration.py bench/out/train-throughput-gpu.json"
