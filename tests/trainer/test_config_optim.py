import math

import pytest

from lmforge.common.errors import ConfigError
from lmforge.model.config import GPTConfig
from lmforge.model.transformer import GPT
from lmforge.trainer.__main__ import main
from lmforge.trainer.config import OptimSection, load_train_config
from lmforge.trainer.optim import build_optimizer, learning_rate
from lmforge.trainer.schedule import TrainingPlan


def test_cosine_schedule_warms_up_then_decays_to_the_floor():
    config = OptimSection(lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [learning_rate(s, TrainingPlan.uniform(100), config) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3)


def test_wsd_schedule_is_flat_then_decays():
    config = OptimSection(lr=1.0, warmup_steps=10, schedule="wsd", decay_fraction=0.2, min_lr_ratio=0.0)
    lrs = [learning_rate(s, TrainingPlan.uniform(100), config) for s in range(100)]
    assert set(lrs[10:80]) == {1.0}
    assert lrs[-1] == pytest.approx(0.0) and lrs[85] < 1.0


def test_weight_decay_applies_to_matrices_only():
    model = GPT(GPTConfig(vocab_size=64, context_length=8, n_layer=1, n_head=2, n_embd=16))
    optimizer = build_optimizer(model, OptimSection(weight_decay=0.1), fused=False)
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert sum(p.numel() for g in optimizer.param_groups for p in g["params"]) == model.num_params()


def test_bad_config_names_the_field(tmp_path, capsys):
    with pytest.raises(ConfigError, match="data"):
        load_train_config(None, [])
    with pytest.raises(ConfigError, match="n_embd"):
        load_train_config(None, ["data.sources=[{path: x}]", "model.overrides={n_embd: 30, n_head: 4}"])
    with pytest.raises(ConfigError, match="parallel.mode"):
        load_train_config(None, ["data.sources=[{path: x}]", "parallel.mode=zero3"])
    assert main(["data.sources=[{path: x}]", "model.tie_embeddings=false"]) == 2
    assert capsys.readouterr().err.endswith("lmforge trainer: error: invalid configuration (argument "
                                            "model.tie_embeddings=false):\n  model.tie_embeddings: Extra inputs are "
                                            "not permitted (got False)\n")


def test_missing_data_is_unusable_input_exit_3(tmp_path, capsys):
    assert main(["data.sources=[{path: " + str(tmp_path) + "}]", f"run_dir={tmp_path / 'run'}"]) == 3
    assert capsys.readouterr().err.endswith(f"lmforge trainer: error: data source {tmp_path}: no manifest.json "
                                            "(not a data-prep output)\n")
    assert not (tmp_path / "run").exists()  # nothing written for a run that cannot start


def test_nonfinite_losses_stop_the_run(tmp_path, monkeypatch):
    from lmforge.trainer import train as train_module
    from lmforge.trainer.config import TrainConfig
    from tests.trainer.helpers import random_output

    data = random_output(tmp_path / "data", train_tokens=4000)
    config = TrainConfig.model_validate({
        "data": {"sources": [{"path": str(data)}], "seq_len": 16, "batch_size": 2},
        "model": {"overrides": {"n_layer": 1, "n_embd": 32, "n_head": 2, "context_length": 16}},
        "steps": 10, "max_nonfinite_steps": 3, "run_dir": str(tmp_path / "run")})
    real_forward = GPT.forward

    def poisoned(self, idx, targets=None, **kwargs):
        logits, loss = real_forward(self, idx, targets, **kwargs)
        return logits, loss * float("nan")

    monkeypatch.setattr(GPT, "forward", poisoned)
    with pytest.raises(train_module.NonFiniteLossError, match="3 non-finite steps in a row"):
        train_module.train(config)
    from tests.trainer.helpers import read_metrics

    assert not read_metrics(tmp_path / "run")  # no step was taken


def test_evaluation_on_val_shards_tracks_the_best(tmp_path):
    from lmforge.trainer.config import TrainConfig
    from lmforge.trainer.train import train
    from tests.trainer.helpers import random_output, read_metrics

    data = random_output(tmp_path / "data", train_tokens=20000)
    config = TrainConfig.model_validate({
        "data": {"sources": [{"path": str(data)}], "seq_len": 16, "batch_size": 4},
        "model": {"overrides": {"n_layer": 1, "n_embd": 32, "n_head": 2, "context_length": 16}},
        "optim": {"lr": 0.01, "warmup_steps": 2}, "steps": 30, "eval_every": 10, "eval_batches": 2,
        "run_dir": str(tmp_path / "run")})
    train(config)
    evals = read_metrics(tmp_path / "run", "eval")
    assert [r["step"] for r in evals] == [9, 19, 29]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"]
    assert evals[-1]["best_val_loss"] == min(r["val_loss"] for r in evals)
    assert evals[0]["val_perplexity"] == pytest.approx(math.exp(evals[0]["val_loss"]))
