"""The datatrove comparison (bench/dataprep_bench.py) runs lmforge's pipeline steps beside their
datatrove equivalents from one table; a step without a row stops the bench, naming it."""

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

from lmforge.dataprep.step_registry import DEFAULT_PIPELINE

REPO = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_dataprep_bench", REPO / "bench" / "dataprep_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _datatrove_blocks() -> set[str]:
    """The --filters names bench/datatrove_baseline.py builds (read from its source: it runs in the
    datatrove venv, not this one)."""
    tree = ast.parse((REPO / "bench" / "datatrove_baseline.py").read_text(encoding="utf-8"))
    table = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(target, "id", None) == "DATATROVE_STEPS" for target in node.targets))
    return {key.value for key in table.keys}


def test_default_pipeline_runs_beside_its_datatrove_equivalents():
    bench = _bench()
    lmforge, datatrove, lmforge_only = bench.pipelines(None)
    assert lmforge == list(DEFAULT_PIPELINE)
    assert datatrove == [bench.STEP_TABLE[step] for step in DEFAULT_PIPELINE if bench.STEP_TABLE[step]]
    assert {"langid", "gopher_repetition", "gopher_quality", "pii"} <= set(datatrove)
    assert set(datatrove) <= _datatrove_blocks()
    assert set(lmforge_only) == {step for step in DEFAULT_PIPELINE if bench.STEP_TABLE[step] is None}


def test_a_step_without_a_row_stops_the_bench():
    with pytest.raises(SystemExit, match=r"no datatrove equivalent known for \['fancy_filter'\]"):
        _bench().pipelines("langid,fancy_filter")
