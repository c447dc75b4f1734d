"""The vLLM backend's init container (`python -m lmforge.inference.fetch_model`, run as the chart
runs it): it follows a model pointer in S3 (moto) to a Hugging Face format package and copies
every file of it (tokenizer_config.json and generation_config.json included, which vLLM reads)
into the output directory, verified; it refuses lmforge's own format, a corrupted package and a
missing one with their exit codes, leaving an earlier output in place."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from lmforge.model.config import GPTConfig
from lmforge.model.hf_package import write_hf_package
from lmforge.model.package import write_package
from lmforge.model.pointer import point_to
from lmforge.model.transformer import GPT
from tests.serving import CONFIG, corrupted_copy, train_tokenizer, upload_package

BUCKET = "fetch"
POINTER = f"s3://{BUCKET}/models/current"


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """An untrained tiny model in both formats (fetching checks files, not answers)."""
    root = tmp_path_factory.mktemp("packages")
    tokenizer = train_tokenizer(root / "tokenizer.json")
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", vocab_size=320, **CONFIG)).eval()
    return (write_hf_package(model, tokenizer, root / "hf", step=7),
            write_package(model, tokenizer, root / "lmforge", step=7))


def fetch(model: str, output, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lmforge.inference.fetch_model", "--model", model,
                           "--output", str(output)], capture_output=True, text=True, timeout=120, env=env)


def test_follows_the_pointer_and_copies_the_whole_hf_package(s3, packages, tmp_path):
    endpoint, make_bucket = s3
    client = make_bucket(BUCKET)
    hf, lmforge_format = packages
    package = upload_package(client, BUCKET, "models/r1-hf", hf)
    point_to(POINTER, package, set_by="test")
    env = dict(os.environ)
    output = tmp_path / "models" / "served"

    result = fetch(POINTER, output, env)
    assert result.returncode == 0, result.stderr
    assert {p.name for p in hf.iterdir()} <= {p.name for p in output.iterdir()}
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (output / name).read_bytes() == (hf / name).read_bytes()
    source = json.loads((output / "lmforge-source.json").read_text())
    assert source == {"model": POINTER, "package": package, "step": 7}
    assert json.loads(result.stdout.splitlines()[-1])["event"] == "model_fetched"

    # lmforge's own format: vLLM cannot load it (exit 2), and the fetched package stays.
    other = upload_package(client, BUCKET, "models/r1", lmforge_format)
    point_to(POINTER, other, set_by="test")
    refused = fetch(POINTER, output, env)
    assert refused.returncode == 2 and "not in Hugging Face format" in refused.stderr
    assert (output / "model.safetensors").read_bytes() == (hf / "model.safetensors").read_bytes()

    # A corrupted package (its weights no longer match config.json's checksum): exit 3.
    bad = upload_package(client, BUCKET, "models/r1-bad", corrupted_copy(hf, tmp_path / "bad"))
    point_to(POINTER, bad, set_by="test")
    corrupted = fetch(POINTER, output, env)
    assert corrupted.returncode == 3 and "sha256" in corrupted.stderr

    # No package there at all: exit 3, one line.
    missing = fetch(f"s3://{BUCKET}/models/nothing-here", tmp_path / "none", env)
    assert missing.returncode == 3 and "no model package" in missing.stderr
    assert not (tmp_path / "none").exists()


def test_a_local_package_is_copied_as_it_is(packages, tmp_path):
    hf, _ = packages
    result = fetch(str(hf), tmp_path / "served", dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "served" / "config.json").read_bytes() == (hf / "config.json").read_bytes()
