"""Determinism and resume: two runs give byte-identical shards; a run killed midway and
rerun gives the same output as one never interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmforge.sample_data.wet import write_sample_wet
from tests.dataprep.helpers import manifest, run_cli

SMALL = ["--set", "tokenizer.vocab_size=800", "--set", "shards.shard_tokens=30000", "--set", "shards.val_fraction=0.05"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    base = tmp_path_factory.mktemp("resume-inputs")
    paths = []
    for seed in range(4):
        path = base / f"in-{seed}.warc.wet.gz"
        write_sample_wet(path, 150, 100 + seed)
        paths.append(path)
    return paths


def _fingerprint(out: Path) -> dict[str, bytes]:
    files = {}
    for sub in ("shards", "lineage"):
        for path in sorted((out / sub).iterdir()):
            files[f"{sub}/{path.name}"] = path.read_bytes()
    files["manifest.json"] = (out / "manifest.json").read_bytes()
    files["tokenizer.json"] = (out / "tokenizer.json").read_bytes()
    return files


@pytest.fixture(scope="module")
def reference(inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "out"
    assert run_cli("run", "--input", *inputs, "--output", out, "--workers", 1, *SMALL) == 0
    return out


@pytest.mark.slow
def test_two_runs_are_byte_identical(inputs, reference, tmp_path):
    out = tmp_path / "again"
    assert run_cli("run", "--input", *inputs, "--output", out, "--workers", 2, *SMALL) == 0
    assert _fingerprint(out) == _fingerprint(reference)


@pytest.mark.slow
def test_kill_and_resume_gives_identical_output(inputs, reference, tmp_path):
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "lmforge.dataprep", "run", "--input", *map(str, inputs), "--output", str(out),
               "--workers", "1", *SMALL]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    marker = out / "work" / "done" / "input-000001"
    deadline = time.monotonic() + 120
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "manifest.json").exists()
    done_before = sorted(p.name for p in (out / "work" / "done").iterdir())
    assert "input-000000" in done_before and "input-000003" not in done_before
    assert run_cli("run", "--input", *inputs, "--output", out, "--workers", 1, *SMALL) == 0
    assert _fingerprint(out) == _fingerprint(reference)
    assert manifest(out)["shards"] == manifest(reference)["shards"]


def test_rerun_of_a_finished_run_changes_nothing(inputs, reference):
    before = {p: p.stat().st_mtime_ns for p in reference.rglob("*") if p.is_file() and "report" not in p.name}
    assert run_cli("run", "--input", *inputs, "--output", reference, "--workers", 1, *SMALL) == 0
    after = {p: p.stat().st_mtime_ns for p in reference.rglob("*") if p.is_file() and "report" not in p.name}
    assert before == after


def test_other_config_or_inputs_in_the_same_output_is_refused(inputs, reference, capsys):
    assert run_cli("run", "--input", *inputs, "--output", reference, "--workers", 1, *SMALL,
                   "--set", "langid.threshold=0.3") == 2
    assert "different config" in capsys.readouterr().err
    assert run_cli("run", "--input", *inputs[:2], "--output", reference, "--workers", 1, *SMALL) == 2
    assert "different input list" in capsys.readouterr().err
    assert (reference / "manifest.json").exists()


def test_key_range_partitions_give_the_same_result(inputs, reference, tmp_path):
    out = tmp_path / "sliced"
    assert run_cli("run", "--input", *inputs, "--output", out, "--workers", 1, *SMALL,
                   "--set", "minhash.partitions_per_band=3") == 0
    assert (out / "work" / "dedup" / "edges-0047.npy").exists()  # 16 bands x 3 slices + url + content - 1
    ref, sliced = manifest(reference), manifest(out)
    assert [s["sha256"] for s in sliced["shards"]] == [s["sha256"] for s in ref["shards"]]
