"""Storage errors in data prep: one line on stderr, exit 4 (docs/design.md, Conventions), nothing already written lost,
and a rerun after the fault writes the same bytes as a run that never failed.

The full disk is real, made without root: the child process runs under RLIMIT_FSIZE (a write
that would grow a file past the limit fails with EFBIG, SIGXFSZ ignored as Python does). It is
portable to any CI runner, unlike a small tmpfs (a mount needs root or user namespaces), and it
fails the same write()/flush() calls an ENOSPC does. The limit is chosen from a clean run so that
every file but the shard fits: the fault comes in the last data phase, after everything else.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmforge.sample_data.wet import write_sample_wet
from tests.dataprep.helpers import run_cli
from tests.shard_listing import listed_shards

# MinHash signatures of 16 values: the dedup key files (signatures in every band section) stay smaller
# than a shard, the file this test makes the one that does not fit
SMALL = ["--set", "tokenizer.vocab_size=600", "--set", "shards.val_fraction=0", "--set", "minhash.num_perm=16"]
# the child sets its own file-size limit, then runs the CLI as `python -m lmforge.dataprep` would
LIMITED = ("import resource, runpy, signal, sys; limit = int(sys.argv.pop(1)); "
           "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)); signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
           "sys.argv[0] = 'lmforge-dataprep'; runpy.run_module('lmforge.dataprep', run_name='__main__')")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "in.warc.wet.gz"
    write_sample_wet(path, 120, 5)
    return path


def run_limited(limit: int, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LIMITED, str(limit), *map(str, args)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_output_that_is_a_file_is_a_storage_error(tmp_path, corpus, capsys):
    target = tmp_path / "out"
    target.write_text("precious")
    assert run_cli("run", "--input", corpus, "--output", target, "--workers", 1) == 4
    assert capsys.readouterr().err == f"lmforge-dataprep run: error: output {target} is a file, not a directory\n"
    assert target.read_text() == "precious"
    assert run_cli("run", "--input", corpus, "--output", target / "sub", "--workers", 1) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Not a directory (ENOTDIR)" in err and str(target) in err
    assert run_cli("report", "--output", target) == 4


def test_disk_full_is_one_line_exit_4_and_a_rerun_writes_identical_shards(tmp_path, corpus):
    clean = tmp_path / "clean"
    assert run_cli("run", "--input", corpus, "--output", clean, "--workers", 1, *SMALL) == 0
    sizes = {rel: len(data) for rel, data in files(clean).items()}
    limit = max(size for rel, size in sizes.items() if not rel.startswith("shards/")) + 1
    assert max(size for rel, size in sizes.items() if rel.startswith("shards/")) > limit

    out = tmp_path / "out"
    failed = run_limited(limit, "run", "--input", corpus, "--output", out, "--workers", 1, *SMALL)
    assert failed.returncode == 4, failed.stderr[-3000:]
    assert "Traceback" not in failed.stderr
    assert failed.stderr == ("lmforge-dataprep run: error: storage error: File too large (EFBIG): "
                             f"{out}/shards/train_000000_0000.bin\n")
    failure = [json.loads(line) for line in failed.stdout.splitlines()][-1]
    assert (failure["event"], failure["kind"], failure["errno"]) == ("failed", "OSError", "EFBIG")

    # nothing half-written is visible, and what the phases before the fault wrote is intact
    before = files(out)
    assert not [rel for rel in before if ".tmp-" in rel or rel.startswith("shards/")]
    assert "manifest.json" not in before
    for rel in ("tokenizer.json", "work/done/input-000000", "work/done/tokenize-000000"):
        assert before[rel] == files(clean)[rel], rel

    rerun = subprocess.run([sys.executable, "-m", "lmforge.dataprep", "run", "--input", str(corpus), "--output",
                            str(out), "--workers", "1", *SMALL], capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    phases = [json.loads(line) for line in rerun.stdout.splitlines()]
    assert [e["pending"] for e in phases if e["event"] == "phase_start" and e["phase"] == "inputs"] == [0]
    after, reference = files(out), files(clean)
    shards = sorted(rel for rel in reference if rel.startswith("shards/"))
    assert shards and sorted(rel for rel in after if rel.startswith("shards/")) == shards
    for rel in shards:
        assert after[rel] == reference[rel], rel
    digests = [[s["sha256"] for s in listed_shards(json.loads(tree["manifest.json"]), tree.get)]
               for tree in (after, reference)]
    assert digests[0] == digests[1]
