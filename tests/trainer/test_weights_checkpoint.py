"""Weights-only packages (lmforge.trainer.weights_checkpoint) in one process: the cadence, bit-for-bit
equality with `export` of the full checkpoint of the same step (model-only save and from-full), a
blocked time within a full async save's, deferral while a save is in flight, retention, the zero fault,
and a real short training run whose packages load."""

from __future__ import annotations

import hashlib
import json
import statistics

import pytest
import torch

from lmforge.common.checkpoint_layout import committed_steps, step_dir
from lmforge.model.package import load_package
from lmforge.model.transformer import GPT
from lmforge.trainer.checkpoint import Checkpointer
from lmforge.trainer.config import OptimSection, TrainConfig
from lmforge.trainer.export import export
from lmforge.trainer.optim import build_optimizer
from lmforge.trainer.weights_checkpoint import SCRATCH, WeightsSaver
from tests.trainer.helpers import random_output, read_metrics

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # DCP warns when no process group exists


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return random_output(tmp_path_factory.mktemp("weights") / "data", train_tokens=8000)


def make_config(data, run_dir, *, n_embd=32, steps=100, **checkpoint) -> TrainConfig:
    return TrainConfig.model_validate({
        "data": {"sources": [{"path": str(data)}], "seq_len": 16, "batch_size": 4},
        "model": {"overrides": {"n_layer": 2, "n_embd": n_embd, "n_head": 2, "context_length": 16}},
        "steps": steps, "run_dir": str(run_dir), "checkpoint": checkpoint})


class Run:
    """A model, optimizer, Checkpointer and WeightsSaver as the trainer builds them (one process)."""

    def __init__(self, data, run_dir, *, clock=None, trained_with=None, **checkpoint):
        self.config = config = make_config(data, run_dir, **checkpoint)
        model_config = config.model.build(vocab_size=256)
        torch.manual_seed(0)
        self.model = GPT(model_config)
        self.optimizer = build_optimizer(self.model, OptimSection(), fused=False)
        self.step()
        tokenizer = trained_with or data / "tokenizer.json"
        self.meta = {"config": config.model_dump(mode="json"), "tokenizer_sha256": sha256(tokenizer), "world_size": 1,
                     "model_config": model_config.model_dump(mode="json")}
        self.checkpointer = Checkpointer(run_dir / "checkpoints", keep=3, async_save=True,
                                         purge_requires_upload=config.checkpoint.purge_requires_upload)
        self.records: list[tuple[str, dict]] = []
        self.weights = WeightsSaver(run_dir / "weights", config, self.checkpointer,
                                    tokens_after=lambda step: 64 * (step + 1),
                                    tokenizer_sha256=self.meta["tokenizer_sha256"],
                                    record=lambda kind, record: self.records.append((kind, record)),
                                    **({"clock": clock} if clock else {}))

    def step(self) -> None:
        batch = torch.randint(0, 256, (2, 17))
        _, loss = self.model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def full_save(self, step: int) -> float:
        self.weights.before_full_save()
        return self.checkpointer.save(step, self.model, self.optimizer, self.meta)

    def close(self) -> None:
        self.weights.close(self.model, self.meta)
        self.checkpointer.close()


def test_cadence_by_steps_and_by_rank_0s_clock(data, tmp_path):
    now = [0.0]
    run = Run(data, tmp_path, clock=lambda: now[0], steps=20, weights_every=5, weights_every_minutes=2)
    weights = run.weights
    assert [s for s in range(20) if weights.step_due(s)] == [4, 9, 14, 19]  # and always the last step
    assert not weights.clock_due(119.0) and weights.clock_due(120.0)
    assert weights.due(3, 120.0) and weights.due(4, 0.0) and not weights.due(3, 60.0)
    now[0] = 200.0
    weights.save(3, run.model, run.meta)  # a package restarts the clock
    assert not weights.clock_due(300.0) and weights.clock_due(320.0)
    run.close()
    off = make_config(data, tmp_path / "off")
    assert not off.checkpoint.weights_enabled
    assert make_config(data, tmp_path, weights_every_minutes=0.5).checkpoint.weights_enabled
    with pytest.raises(ValueError, match="weights_keep"):
        make_config(data, tmp_path, weights_keep=0)


def test_a_run_without_its_tokenizer_is_refused_before_training(data, tmp_path):
    import shutil

    from lmforge.common.errors import InputError

    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    (copy / "tokenizer.json").write_bytes(b"another tokenizer")
    with pytest.raises(InputError, match="not the tokenizer"):
        Run(copy, tmp_path / "run", trained_with=data / "tokenizer.json", weights_every=1)


def test_packages_equal_export_of_the_full_checkpoint_bit_for_bit(data, tmp_path):
    # model-only save (weights_from_full=false) at step 3, and the from-full path at step 5
    run = Run(data, tmp_path, weights_every=1, weights_from_full=False)
    run.full_save(3)
    run.checkpointer.wait()
    run.weights.after_step(3, run.model, run.meta, due=True, full_save_started=False)
    run.close()
    from_full = Run(data, tmp_path / "b", weights_every=1)
    from_full.step()
    from_full.full_save(5)
    from_full.weights.after_step(5, from_full.model, from_full.meta, due=True, full_save_started=True)
    from_full.close()
    for root, step in ((tmp_path, 3), (tmp_path / "b", 5)):
        exported = export(step_dir(root / "checkpoints", step), tmp_path / f"export-{step}")
        package = step_dir(root / "weights", step)
        assert committed_steps(root / "weights") == [step]
        for name in ("model.safetensors", "config.json", "tokenizer.json"):
            assert sha256(package / name) == sha256(exported / name), (step, name)
        assert json.loads((package / "meta.json").read_text()) == {
            "step": step, "tokens": 64 * (step + 1), "run": root.name, "val_loss": None, "final": False}
        load_package(package, require_checksums=True)
    assert not (tmp_path / "weights" / SCRATCH / "step-00000003").exists()  # the scratch save is removed
    assert [r["source"] for _, r in run.records] == ["model_save"]
    assert [r["source"] for _, r in from_full.records] == ["checkpoint"]


def test_blocked_no_longer_than_a_full_async_save_and_deferred_while_one_is_in_flight(data, tmp_path):
    run = Run(data, tmp_path, n_embd=256, weights_every=1, weights_from_full=False, weights_keep=10)
    full, weights = [], []
    for step in range(0, 8, 2):
        full.append(run.full_save(step))
        run.checkpointer.wait()
        weights.append(run.weights.save(step + 1, run.model, run.meta))
        run.weights.before_full_save()
    # medians over the rounds (the first of each fills its stager's buffers)
    assert statistics.median(weights[1:]) <= statistics.median(full[1:]), (weights, full)

    run.full_save(10)  # in flight (not polled yet): a package due now waits for it
    assert run.weights.after_step(10, run.model, run.meta, due=True, full_save_started=False) == 0.0
    assert run.weights.wanted and run.weights._future is None
    run.checkpointer.wait()
    run.step()  # the deferred package holds the weights of the step it is saved at
    run.weights.after_step(11, run.model, run.meta, due=False, full_save_started=False)
    assert not run.weights.wanted
    expected = {k: v.clone() for k, v in run.model.state_dict().items()}
    run.close()
    assert committed_steps(tmp_path / "weights") == [1, 3, 5, 7, 11]
    model, meta = load_package(step_dir(tmp_path / "weights", 11))
    assert meta["step"] == 11
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name


def test_retention_keeps_the_newest_and_what_the_store_lacks(data, tmp_path):
    run = Run(data, tmp_path, weights_every=1, weights_keep=2)
    for step in range(4):
        run.weights.after_step(step, run.model, run.meta, due=True, full_save_started=False)
        run.weights.before_full_save()
    run.close()
    assert committed_steps(tmp_path / "weights") == [2, 3]
    purge = Run(data, tmp_path / "purge", weights_every=1, weights_keep=1, purge_requires_upload=True)
    for step in range(3):
        purge.weights.after_step(step, purge.model, purge.meta, due=True, full_save_started=False)
        purge.weights.before_full_save()
    purge.close()
    assert committed_steps(tmp_path / "purge" / "weights") == [0, 1, 2]  # none is in a store


def test_zero_weights_fault_zeroes_that_package_only(data, tmp_path, monkeypatch):
    monkeypatch.setenv("LMFORGE_TRAINER_ZERO_WEIGHTS_AT_STEP", "1")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    run = Run(data, tmp_path, weights_every=1)
    for step in range(3):
        run.weights.after_step(step, run.model, run.meta, due=True, full_save_started=False)
        run.weights.before_full_save()
    run.close()
    for step in range(3):
        model, _ = load_package(step_dir(tmp_path / "weights", step))
        zero = all(not p.any() for p in model.parameters())
        assert zero == (step == 1), step
    assert [r.get("zeroed", False) for _, r in run.records] == [False, True, False]
    assert run.model.wte.weight.any()  # training's weights are untouched


def test_a_training_run_writes_packages_that_load(data, tmp_path):
    from lmforge.trainer.train import train

    config = TrainConfig.model_validate({
        "data": {"sources": [{"path": str(data)}], "seq_len": 16, "batch_size": 4},
        "model": {"overrides": {"n_layer": 1, "n_embd": 32, "n_head": 2, "context_length": 16}},
        "optim": {"lr": 0.01, "warmup_steps": 2}, "steps": 6, "log_every": 2, "run_dir": str(tmp_path / "run"),
        # steps 2 and 5 by steps (and saved in full: packaged from those), 0 and 4 by the clock on logged steps;
        # synchronous writes, or a loaded machine may still be writing step 2 at step 4 and rightly defer
        # that package (the deferral has its own test above)
        "checkpoint": {"every": 3, "weights_every": 3, "weights_every_minutes": 1e-6, "weights_keep": 4,
                       "async_save": False}})
    train(config)
    run_dir = tmp_path / "run"
    assert committed_steps(run_dir / "weights") == [0, 2, 4, 5]
    tokens = {r["step"]: r["tokens"] for r in read_metrics(run_dir)}
    for step in (0, 2, 4, 5):
        package = step_dir(run_dir / "weights", step)
        model, meta = load_package(package, require_checksums=True)
        assert meta["step"] == step
        written = json.loads((package / "meta.json").read_text())
        assert written["tokens"] == tokens[step] and written["final"] == (step == 5) and written["run"] == "run"
    exported = export(step_dir(run_dir / "checkpoints", 5), tmp_path / "export")
    assert sha256(step_dir(run_dir / "weights", 5) / "model.safetensors") == sha256(exported / "model.safetensors")
    records = read_metrics(run_dir, "weights")
    assert {r["step"]: r["source"] for r in records} == {0: "model_save", 2: "checkpoint", 4: "model_save",
                                                         5: "checkpoint"}
    assert not (run_dir / "weights" / SCRATCH).exists() or not any((run_dir / "weights" / SCRATCH).iterdir())
