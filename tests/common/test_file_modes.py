"""Files another user can read: every artifact written atomically (data-prep's shards, tokenizer,
manifest and report; the demo summary; the model package; checkpoint files; the training report)
gets the mode a plain write would give it, 0666 less the umask (directories 0777 less it), not
mkstemp's 0600."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch

from lmforge.common.atomic_files import atomic_open, atomic_path, atomic_write_bytes
from lmforge.common.local_store import LocalStore
from lmforge.demo.summary import write_summary
from lmforge.model.config import GPTConfig
from lmforge.model.package import write_package
from lmforge.model.transformer import GPT
from lmforge.sample_data.wet import write_sample_wet
from lmforge.trainer.checkpoint import COMMIT_MARKER, Checkpointer, step_dir
from lmforge.trainer.metrics_file import MetricsFile
from lmforge.trainer.report_html import write_report
from tests.dataprep.helpers import run_cli


@pytest.fixture(params=[0o022, 0o027], ids=["umask-022", "umask-027"])
def umask(request):
    """Runs the test under the umask; returns it (022 → files 0644, 027 → files 0640)."""
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def modes_under(root: Path) -> dict[str, str]:
    """{path relative to root: octal mode} for everything below `root`."""
    return {p.relative_to(root).as_posix(): oct(stat.S_IMODE(p.stat().st_mode)) for p in root.rglob("*")}


def expected_modes(root: Path, umask: int) -> dict[str, str]:
    """What plain open()/mkdir() would have made of everything below `root`."""
    return {p.relative_to(root).as_posix(): oct((0o777 if p.is_dir() else 0o666) & ~umask) for p in root.rglob("*")}


def test_atomic_writes_get_the_mode_of_a_plain_write(tmp_path, umask):
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    atomic_write_bytes(tmp_path / "bytes.bin", b"x")
    with atomic_open(tmp_path / "open.bin") as fh:
        fh.write(b"x")
    with atomic_path(tmp_path / "path.txt") as tmp:
        tmp.write_text("x")
    LocalStore(tmp_path).write_text("store/nested.json", "{}")
    assert modes_under(tmp_path) == expected_modes(tmp_path, umask)
    assert oct(stat.S_IMODE(plain.stat().st_mode)) == oct(0o666 & ~umask)


def test_rewriting_a_file_keeps_its_mode(tmp_path):
    path = tmp_path / "keys.txt"
    for mode in (0o600, 0o664):
        path.write_text("old")
        path.chmod(mode)
        atomic_write_bytes(path, b"new")
        assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == mode


def test_dataprep_artifacts(tmp_path, umask):
    wet = tmp_path / "in.warc.wet.gz"
    write_sample_wet(wet, 60, 3)
    out = tmp_path / "out"
    assert run_cli("run", "--input", wet, "--output", out, "--workers", 1, "--set", "tokenizer.vocab_size=400",
                   "--set", "shards.shard_tokens=20000", "--set", "shards.val_fraction=0.1") == 0
    names = {p.relative_to(out).as_posix() for p in out.rglob("*")}
    for artifact in ("manifest.json", "tokenizer.json", "report.json", "report.html"):
        assert artifact in names
    assert any(n.startswith("shards/") and n.endswith(".bin") for n in names), sorted(names)
    assert modes_under(tmp_path) == expected_modes(tmp_path, umask)


def test_demo_summary(tmp_path, umask):
    write_summary(tmp_path / "summary.json", {"seconds": 1})
    assert json.loads((tmp_path / "summary.json").read_text()) == {"seconds": 1}
    assert modes_under(tmp_path) == expected_modes(tmp_path, umask)


def test_model_package(tmp_path, umask):
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text("{}")
    model = GPT(GPTConfig(vocab_size=64, n_layer=1, n_head=2, n_embd=16, context_length=8))
    package = write_package(model, tokenizer, tmp_path / "models" / "v1", step=3)
    assert sorted(p.name for p in package.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert modes_under(tmp_path) == expected_modes(tmp_path, umask)


def test_training_report(tmp_path, umask):
    metrics = MetricsFile(tmp_path / "metrics.jsonl")
    metrics.write({"kind": "step", "step": 0, "loss": 5.0})
    metrics.close()
    assert write_report(tmp_path).name == "report.html"
    assert modes_under(tmp_path) == expected_modes(tmp_path, umask)


@pytest.mark.filterwarnings("ignore::UserWarning")  # DCP warns when no process group exists
def test_checkpoint_files(tmp_path, umask):
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters())
    checkpointer = Checkpointer(tmp_path / "checkpoints", keep=2, async_save=False)
    checkpointer.save(5, model, optimizer, {"note": "x"}, val_loss=1.0, is_best=True)
    assert (step_dir(tmp_path / "checkpoints", 5) / COMMIT_MARKER).exists()
    assert modes_under(tmp_path) == expected_modes(tmp_path, umask)
