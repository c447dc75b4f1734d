"""`lmforge-train export --format hf` on a real training run's checkpoint, its refusal (exit 2,
one line) for a model transformers cannot compute exactly, and `model.init_from`: a run that
starts from the exported Hugging Face directory (continued pretraining)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

from lmforge.common.errors import ConfigError
from lmforge.model.package import load_package
from lmforge.model.transformer import GPT
from lmforge.sample_data.token_shards import write_output
from lmforge.trainer.cli import main as cli
from tests.serving import train_tokenizer

LLAMA = (
    "model.preset=llama-debug",
    "model.overrides={n_layer: 2, n_head: 4, n_kv_head: 2, n_embd: 64, multiple_of: 32, context_length: 32}",
)
MOE_BIAS = (
    "model.preset=moe-debug",
    "model.overrides={n_layer: 2, n_head: 4, n_kv_head: 2, n_embd: 64, "
    "multiple_of: 32, context_length: 32, moe: {num_experts: 4, balancing: bias, bias_update_rate: 0.01}}",
)


def data_with_a_real_tokenizer(root):
    """A synthetic data-prep output whose tokenizer.json is a real BPE tokenizer (the HF export
    writes its end-of-text token into the tokenizer and generation configs)."""
    root.mkdir(parents=True)
    tokenizer = train_tokenizer(root / "tokenizer.json", vocab_size=300)
    vocab = Tokenizer.from_file(str(tokenizer)).get_vocab_size()
    rng = np.random.default_rng(0)
    tokens = np.resize(rng.integers(1, vocab, 97), 20_000)
    return write_output(
        root,
        {"train": [tokens[:10_000], tokens[10_000:]], "val": [tokens[:2_000]]},
        vocab_size=vocab,
        tokenizer_sha=hashlib.sha256(tokenizer.read_bytes()).hexdigest(),
    )


def train_run(run_dir, data, *settings: str, steps: int = 4) -> subprocess.CompletedProcess:
    overrides = [
        f"data.sources=[{{path: {data}}}]",
        "data.seq_len=32",
        "data.batch_size=4",
        "parallel.mode=none",
        f"steps={steps}",
        "optim.warmup_steps=1",
        "optim.lr=0.003",
        f"run_dir={run_dir}",
        *settings,
    ]
    return subprocess.run(
        [sys.executable, "-m", "lmforge.trainer.cli", "run", "--nproc=1", *overrides],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def last_checkpoint(run_dir):
    return sorted((run_dir / "checkpoints").glob("step-*"))[-1]


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export-hf")
    data = data_with_a_real_tokenizer(tmp / "data")
    result = train_run(tmp / "run", data, *LLAMA)
    assert result.returncode == 0, result.stderr[-2000:]
    return tmp, data, last_checkpoint(tmp / "run")


def test_export_format_hf_loads_in_transformers_with_the_trained_weights(llama_run):
    tmp, _, checkpoint = llama_run
    assert cli(["export", "--checkpoint", str(checkpoint), "--output", str(tmp / "lmforge")]) == 0  # the default
    assert cli(["export", "--checkpoint", str(checkpoint), "--output", str(tmp / "hf"), "--format", "hf"]) == 0
    ours, _ = load_package(tmp / "lmforge")
    hf = AutoModelForCausalLM.from_pretrained(tmp / "hf").eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    ids = torch.randint(1, 256, (2, 32))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids)[0], atol=1e-4, rtol=0)
    assert sorted(p.name for p in (tmp / "hf").iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


def test_a_model_transformers_cannot_compute_exactly_is_refused_with_exit_2(tmp_path, llama_run, capsys):
    _, data, _ = llama_run
    result = train_run(tmp_path / "run", data, *MOE_BIAS, steps=3)
    assert result.returncode == 0, result.stderr[-2000:]
    checkpoint = last_checkpoint(tmp_path / "run")
    capsys.readouterr()
    assert cli(["export", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "hf"), "--format", "hf"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "selection bias" in error and error.startswith("lmforge-train export: error:")
    assert not (tmp_path / "hf").exists()
    assert cli(["export", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "pkg")]) == 0  # lmforge's own


def test_a_run_starts_from_the_hf_directory_with_init_from(tmp_path, llama_run):
    tmp, data, checkpoint = llama_run
    hf_dir = tmp / "hf-init"
    assert cli(["export", "--checkpoint", str(checkpoint), "--output", str(hf_dir), "--format", "hf"]) == 0
    start, _ = load_package(hf_dir)
    # One step at a negligible learning rate: the run's weights are the HF directory's.
    result = train_run(
        tmp_path / "run",
        data,
        "model.preset=tiny",
        f"model.init_from={hf_dir}",
        "optim.lr=1e-9",
        "optim.weight_decay=0",
        steps=1,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert (
        cli(["export", "--checkpoint", str(last_checkpoint(tmp_path / "run")), "--output", str(tmp_path / "pkg")]) == 0
    )
    continued, _ = load_package(tmp_path / "pkg")
    assert continued.config.norm == "rmsnorm" and continued.config.kv_heads == 2  # the package's shape, not tiny's
    for name, tensor in start.state_dict().items():
        torch.testing.assert_close(continued.state_dict()[name], tensor, atol=1e-6, rtol=0)
    fresh = GPT(start.config).state_dict()
    assert not torch.allclose(
        fresh["blocks.0.attn.query.weight"], continued.state_dict()["blocks.0.attn.query.weight"], atol=1e-3
    )


def test_init_from_refuses_a_package_of_another_tokenizer(tmp_path, llama_run):
    from lmforge.trainer.config import ModelSection
    from lmforge.trainer.init_from import initial_weights

    tmp, _, checkpoint = llama_run
    assert cli(["export", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "hf"), "--format", "hf"]) == 0
    with pytest.raises(ConfigError, match="not the tokenizer the training data was tokenized with"):
        initial_weights(ModelSection(init_from=str(tmp_path / "hf")), 256, "0" * 64)
