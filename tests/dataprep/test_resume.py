"""Determinism and resume: two runs give byte-identical shards; a run killed midway and
rerun gives the same output as one never interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmforge.dataprep import layout
from lmforge.dataprep.config import MinHashConfig
from lmforge.dataprep.minhash import lsh_params
from lmforge.dataprep.stages import DEFAULT_MAX_ROUNDS, GLOBAL_STAGES, ROUNDS
from lmforge.sample_data.wet import write_sample_wet
from tests.dataprep.helpers import lineage_rows, manifest, run_cli

SMALL = ["--set", "tokenizer.vocab_size=800", "--set", "shards.shard_tokens=30000", "--set", "shards.val_fraction=0.05",
         "--set", "components.tasks=3"]  # the components in rounds over several tasks


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
    for sub in ("shards", "index", "lineage"):
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
    # the pool serves every phase, and each phase's CPU counts the tasks its pool processes ran
    for phase in ("inputs", "tokenize"):
        cpu = [sum(json.loads(p.read_text())["cpu_seconds"] for p in (root / "work/timings" / phase).glob("*.json"))
               for root in (reference, out)]
        assert cpu[1] > 0.5 * cpu[0] > 0, (phase, cpu)


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
                   "--set", "steps.langid.threshold=0.3") == 2
    assert "different config" in capsys.readouterr().err
    assert run_cli("run", "--input", *inputs[:2], "--output", reference, "--workers", 1, *SMALL) == 2
    assert "different input list" in capsys.readouterr().err
    assert (reference / "manifest.json").exists()


def test_key_range_partitions_give_the_same_result(inputs, reference, tmp_path):
    out = tmp_path / "sliced"
    assert run_cli("run", "--input", *inputs, "--output", out, "--workers", 1, *SMALL,
                   "--set", "minhash.partitions_per_band=3") == 0
    bands, _ = lsh_params(MinHashConfig())
    edge_files = list((out / "work" / "dedup" / "edges").glob("*/*.npy"))
    assert len(edge_files) == (bands + 2) * 3  # every key column (bands, URL, content) in 3 key-range slices
    assert all((out / layout.edges(p)).exists() for p in range(len(edge_files)))
    ref, sliced = manifest(reference), manifest(out)
    assert [s["sha256"] for s in sliced["shards"]] == [s["sha256"] for s in ref["shards"]]


def _staged_run(inputs, out: Path, workers: int) -> None:
    """Every stage as an Indexed Job of `workers` pods would run it: worker k of n takes its slice."""
    for k in range(workers):
        assert run_cli("run", "--input", *inputs, "--output", out, "--workers", 1, *SMALL,
                       "--worker-index", k, "--num-workers", workers) == 0
    for stage in GLOBAL_STAGES:  # as the chart's Jobs run them: one per stage, one per round
        if stage.name == "report":
            break
        for round_ in range(DEFAULT_MAX_ROUNDS if stage.kind == ROUNDS else 1):
            for k in range(workers if stage.split else 1):
                slice_args = ["--workers", 1, "--worker-index", k, "--num-workers", workers] if stage.split else []
                round_args = ["--round", round_] if stage.kind == ROUNDS else []
                assert run_cli(stage.name, "--output", out, *slice_args, *round_args) == 0, stage
    assert not (out / "manifest.json").exists()  # a slice never writes it: the report stage does
    assert run_cli("report", "--output", out) == 0


@pytest.mark.parametrize("workers", [2, 8])
def test_output_is_the_same_whatever_the_number_of_workers_at_each_stage(inputs, reference, tmp_path, workers):
    out = tmp_path / f"staged-{workers}"
    _staged_run(inputs, out, workers)
    assert _fingerprint(out) == _fingerprint(reference)
    names = [sorted(p.name for p in (root / "shards").iterdir()) for root in (out, reference)]
    assert names[0] == names[1]


def test_each_shard_partition_writes_only_its_own_inputs_documents(inputs, reference):
    entries = manifest(reference)["shards"]
    partitions = {entry["path"].split("_")[1] for entry in entries}
    assert partitions == {f"{i:06d}" for i in range(len(inputs))}
    for row in lineage_rows(reference):
        assert row["doc_id"].split("-")[0] == row["shard"].split("_")[1], row  # doc id 'IIIIII-RRRRRRRR'


def test_a_killed_shard_task_is_redone_alone(inputs, reference, tmp_path):
    """A task killed before its completion marker leaves at most some of its own files; the rerun
    rewrites that partition and touches nothing else."""
    import shutil

    out = tmp_path / "killed-shards"
    shutil.copytree(reference, out)
    (out / "manifest.json").unlink()
    (out / "work/shards/partition-000002.json").unlink()  # the marker, written last
    for path in (out / "shards").glob("train_000002_*"):
        path.unlink()
    before = {p: p.stat().st_mtime_ns for p in (out / "shards").iterdir()}
    assert run_cli("shards", "--output", out, "--workers", 1) == 0
    rewritten = {p.name for p in (out / "shards").iterdir() if before.get(p) != p.stat().st_mtime_ns}
    assert rewritten and all(name.split("_")[1] == "000002" for name in rewritten), rewritten
    assert _fingerprint(out) == _fingerprint(reference)


def test_partitions_of_several_inputs_shuffle_them_together(inputs, reference, tmp_path):
    out = tmp_path / "pairs"
    assert run_cli("run", "--input", *inputs, "--output", out, "--workers", 1, *SMALL,
                   "--set", "shards.inputs_per_partition=3") == 0
    paired, ref = manifest(out), manifest(reference)
    assert {entry["path"].split("_")[1] for entry in paired["shards"]} == {"000000", "000001"}  # inputs 0-2, 3
    assert paired["totals"]["documents"] == ref["totals"]["documents"]
    assert paired["totals"]["tokens"] == ref["totals"]["tokens"]
    first = [row for row in lineage_rows(out) if row["shard"].startswith("shards/train_000000_")]
    assert {row["doc_id"].split("-")[0] for row in first} == {"000000", "000001", "000002"}


def test_the_tokenizer_sample_reads_only_as_many_inputs_as_it_needs(inputs, reference):
    from lmforge.common.local_store import LocalStore
    from lmforge.dataprep import layout
    from lmforge.dataprep.config import TokenizerConfig
    from lmforge.dataprep.tokenize import iter_training_sample

    class Recording(LocalStore):
        touched: set[str] = set()

        def local_path(self, rel):
            self.touched.add(rel)
            return super().local_path(rel)

        def read_bytes(self, rel):
            self.touched.add(rel)
            return super().read_bytes(rel)

    def sample(limit: int) -> tuple[int, set[str]]:
        store = Recording(reference)
        store.touched = set()
        texts = list(iter_training_sample(store, len(inputs), TokenizerConfig(sample_bytes=limit), seed=1234))
        return sum(len(t.encode()) for t in texts), {rel for rel in store.touched if rel.startswith("work/docs/")}

    whole, every_input = sample(1 << 40)
    assert every_input == {layout.docs(i) for i in range(len(inputs))}
    small, read = sample(whole // 10)
    assert len(read) == 1 and whole // 10 <= small < whole // 2  # one input was enough
