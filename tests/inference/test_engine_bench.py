"""bench/serve/engine_bench.py's sides: each worker runs the engine from the sources it is given
(the baseline's extracted tree), not from the working tree the venv's editable installs point at."""

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_engine_bench", REPO / "bench" / "serve" / "engine_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_side_runs_the_engine_of_its_own_sources_and_the_table_reads_its_rows(bench, tmp_path):
    for service in ("common", "model", "inference"):  # a copy stands for the extracted baseline
        shutil.copytree(REPO / "services" / service / "src", tmp_path / "services" / service / "src",
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    sources = bench.source_dirs(tmp_path)
    assert len(sources) == 3
    side = bench.run_side("old", sources, [{"figure": "prefix", "prefix_caching": False, "count": 3, "seed": 4}])
    assert side["engine_file"].startswith(str(tmp_path / "services" / "inference" / "src"))
    assert side["threads"] == 1
    row = side["results"][0]
    context, slots = 1024, bench.BUDGET_SEQUENCES[4]
    assert row["requests"] == 3 and row["budget_bytes"] == slots * context * 2 * 4 * 128 * 4  # tiny: 4 layers, d=128
    assert 0 < row["ttft_p50_ms"] <= row["ttft_p95_ms"]
    rows = bench.tables({4: {"old": side, "new": side}})
    assert rows[2].startswith("| 4. TTFT mean, 512-token shared prefix + 32 distinct, 2 after the first")


def test_a_revision_that_is_not_there_is_one_clear_error(bench, tmp_path):
    with pytest.raises(SystemExit, match="--baseline-rev no-such-rev: git archive failed"):
        bench.extract_baseline("no-such-rev", tmp_path)
