"""`lmforge-train export`: sharded checkpoints of any world size → one serving package."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from lmforge.common.errors import InputError
from lmforge.model.package import load_package
from lmforge.trainer.cli import main as cli
from lmforge.trainer.export import export
from tests.trainer.helpers import random_output

MODEL = "model.overrides={n_layer: 2, n_head: 4, n_embd: 64, context_length: 32}"


def train_run(run_dir, data, nproc: int, mode: str, batch_size: int, *extra: str):
    overrides = [f"data.sources=[{{path: {data}}}]", "data.seq_len=32", f"data.batch_size={batch_size}",
                 f"parallel.mode={mode}", "steps=10", "optim.warmup_steps=2", "optim.lr=0.003", f"run_dir={run_dir}",
                 MODEL, *extra]
    command = [sys.executable, "-m", "lmforge.trainer.cli", "run", f"--nproc={nproc}", *overrides]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    return run_dir / "checkpoints" / "step-00000009"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    data = random_output(tmp / "data")
    # the FSDP run also writes weights packages from model-only saves (step 9's deferred past its full save)
    fsdp = train_run(tmp / "fsdp", data, 2, "fsdp", 4, "checkpoint.weights_every=5",
                     "checkpoint.weights_from_full=false")
    return tmp, data, train_run(tmp / "one", data, 1, "none", 8), fsdp


@pytest.mark.slow
def test_fsdp_shards_consolidate_to_the_same_weights_as_one_rank(runs):
    tmp, _, single, sharded = runs
    assert cli(["export", "--checkpoint", str(single), "--output", str(tmp / "pkg-one")]) == 0
    assert cli(["export", "--checkpoint", str(sharded), "--output", str(tmp / "pkg-fsdp")]) == 0
    one, meta = load_package(tmp / "pkg-one")
    fsdp, _ = load_package(tmp / "pkg-fsdp")
    assert meta["step"] == 9 and meta["model"]["n_layer"] == 2
    for (name, a), (_, b) in zip(one.state_dict().items(), fsdp.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-4), name
    assert one.lm_head.weight.data_ptr() == one.wte.weight.data_ptr()
    idx = torch.randint(0, 256, (1, 16))
    assert torch.allclose(one(idx)[0], fsdp(idx)[0], atol=1e-3)


@pytest.mark.slow
def test_fsdp_weights_package_equals_export_of_the_full_checkpoint(runs):
    import hashlib

    from lmforge.common.checkpoint_layout import committed_steps

    tmp, _, _, sharded = runs
    weights = sharded.parents[1] / "weights"
    assert committed_steps(weights) == [4, 9]
    exported = export(sharded, tmp / "pkg-fsdp-9")
    for name in ("model.safetensors", "config.json"):
        assert hashlib.sha256((weights / "step-00000009" / name).read_bytes()).digest() == \
            hashlib.sha256((exported / name).read_bytes()).digest(), name
    model, meta = load_package(weights / "step-00000004", require_checksums=True)
    assert meta["step"] == 4


def test_package_files_and_checks(runs):
    tmp, data, single, _ = runs
    out = export(single, tmp / "pkg")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (out / "tokenizer.json").read_bytes() == (data / "tokenizer.json").read_bytes()
    (out / "tokenizer.json").write_bytes(b"{}")
    with pytest.raises(InputError, match="does not match"):
        load_package(out)


def test_uncommitted_checkpoint_or_wrong_tokenizer_is_refused(runs, tmp_path):
    _, data, single, _ = runs
    import shutil

    copy = tmp_path / "ckpt"
    shutil.copytree(single, copy)
    (copy / "COMMITTED").unlink()
    with pytest.raises(InputError, match="not a committed checkpoint"):
        export(copy, tmp_path / "pkg")
    original = (data / "tokenizer.json").read_bytes()
    try:
        (data / "tokenizer.json").write_bytes(b"another tokenizer")
        assert cli(["export", "--checkpoint", str(single), "--output", str(tmp_path / "pkg")]) == 3
    finally:
        (data / "tokenizer.json").write_bytes(original)
    assert not (tmp_path / "pkg").exists()
