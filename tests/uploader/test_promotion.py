"""Scores, the best checkpoint and its promotion: only a new best is promoted, so a regressed
(zeroed) checkpoint never is; pointer mode copies the package (verified, config.json last) and
points the model pointer at the copy; propose writes evals/proposal.json; off only records.
`evals-finalize` is idempotent."""

from __future__ import annotations

import json
import math

import pytest

from lmforge.model.package import verify_package
from lmforge.model.pointer import read_pointer
from lmforge.uploader.cli import eval_launcher, open_destination
from lmforge.uploader.config import UploaderConfig
from lmforge.uploader.metrics import UploaderMetrics
from lmforge.uploader.promotion import best, regressed, score_of
from tests.uploader.helpers import fake_weights, files_of, in_process_uploader, run_uploader

ZEROED = math.log(64)  # a zeroed model predicts uniformly over its 64 tokens


def result(step: int, loss: float, acc: float) -> dict:
    return {"step": step, "tokens": step * 100, "heldout": {"val": {"loss": loss, "perplexity": math.exp(loss)}},
            "tasks": {"tiny_mc": {"acc": acc}}, "seconds": 0.1}


def test_scores_best_and_regressions():
    results = {10: result(10, 3.0, 0.6), 20: result(20, 2.5, 0.8), 30: result(30, ZEROED, 0.25)}
    results[30]["heldout"]["code"] = {"loss": 2.0, "perplexity": 7.4}
    assert score_of(results[30], "heldout/loss") == pytest.approx((ZEROED + 2.0) / 2)  # the mean over sources
    assert score_of(results[10], "tiny_mc/acc") == 0.6 and score_of(results[10], "other/acc") is None
    assert best(results, "heldout/loss", "min") == (20, 2.5)
    assert best(results, "tiny_mc/acc", "max") == (20, 0.8)
    assert best({1: result(1, 2.0, 0.5), 2: result(2, 2.0, 0.5)}, "heldout/loss", "min") == (1, 2.0)  # ties: earlier
    earlier = {10: results[10], 20: results[20]}
    assert regressed(30, results[30], earlier, 0.1, 0.5) == ["tiny_mc/acc", "heldout/val"]
    assert regressed(30, result(30, 2.9, 0.75), earlier, 0.1, 0.5) == []  # within both thresholds
    assert regressed(15, result(15, 3.0, 0.45), earlier, 0.1, 0.5) == ["tiny_mc/acc"]  # only steps up to its own
    # a weighted set: accuracy up, held-out loss down, in one number to maximize
    combined = "2*tiny_mc/acc + -0.5*heldout/loss"
    assert score_of(results[10], combined) == pytest.approx(2 * 0.6 - 0.5 * 3.0)
    assert best(results, combined, "max") == (20, pytest.approx(2 * 0.8 - 0.5 * 2.5))
    assert score_of(results[10], "tiny_mc/acc + other/acc") is None  # a term missing: no score, never the best


class Run:
    """Packages uploaded to a file:// store, results landing there as eval jobs write them, and
    a launcher (no runner: it ingests and promotes) configured by `evaluation`."""

    def __init__(self, tmp_path, **evaluation):
        self.tmp = tmp_path
        self.weights_dir, self.store = tmp_path / "r1" / "weights", tmp_path / "store"
        self.config = UploaderConfig.model_validate({"evaluation": {
            "enabled": True, "command": ["unused"], **evaluation}})
        self.launcher = eval_launcher(open_destination(f"file://{self.store}", self.config.transfer),
                                      self.weights_dir, self.config, UploaderMetrics(), None, runner=False)

    def evaluated(self, step: int, loss: float, acc: float = 0.5) -> dict:
        fake_weights(self.weights_dir, step)
        uploader = in_process_uploader(self.weights_dir, f"file://{self.store}", kind="weights")
        try:
            assert uploader.run_once() == [step]
        finally:
            uploader.close()
        (self.store / "evals").mkdir(exist_ok=True)
        (self.store / "evals" / f"step-{step:08d}.json").write_text(json.dumps(result(step, loss, acc)))
        self.launcher.step()
        return self.records()[-1]

    def records(self) -> list[dict]:
        return [json.loads(line) for line in (self.weights_dir.parent / "evals.jsonl").read_text().splitlines()]

    def best_json(self) -> dict:
        return json.loads((self.store / "evals" / "best.json").read_text())


def test_pointer_mode_promotes_each_new_best_never_the_zeroed_one(tmp_path):
    models = tmp_path / "models"
    run = Run(tmp_path, promote="pointer", pointer=f"file://{models}/current", models_store=f"file://{models}")
    assert run.evaluated(10, 3.0)["promoted"] is True
    assert run.evaluated(20, 2.5)["promoted"] is True
    zeroed = run.evaluated(30, ZEROED)
    assert (zeroed["promoted"], zeroed["best_step"], zeroed["regressed"]) == (False, 20, ["heldout/val"])
    assert run.evaluated(40, 2.4)["promoted"] is True

    pointer = read_pointer(f"file://{models}/current")
    assert pointer.model == f"file://{models}/r1-step-40"
    assert [p.model for p in pointer.previous] == [f"file://{models}/r1-step-20", f"file://{models}/r1-step-10"]
    copy = models / "r1-step-40"
    verify_package(copy, require_checksums=True)
    source = files_of(run.store / "weights" / "step-00000040")
    assert files_of(copy) == {k: source[k] for k in ("model.safetensors", "tokenizer.json", "config.json")}
    assert run.best_json() == {"step": 40, "score": 2.4, "package": f"file://{run.store}/weights/step-00000040",
                               "promoted_to": f"file://{models}/r1-step-40"}
    assert run.launcher.metrics.eval_promoted_step.value == 40

    # evals-finalize after the run: nothing new to ingest, the same best; twice is the same as once.
    pointer_bytes = (models / "current").read_bytes()
    for _ in range(2):
        done = run_uploader("evals-finalize", "--dest", f"file://{run.store}", "--weights-dir", str(run.weights_dir),
                            "--set", "evaluation.promote=pointer", "--set", f"evaluation.pointer=file://{models}/current",
                            "--set", f"evaluation.models_store=file://{models}", timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert len(run.records()) == 4 and run.best_json()["step"] == 40
        assert (models / "current").read_bytes() == pointer_bytes  # not even a new set_at


def test_finalize_ingests_results_the_sidecar_never_saw(tmp_path):
    """Results that landed after the sidecar stopped: finalize records them and promotes the best."""
    run = Run(tmp_path, promote="propose")
    run.evaluated(10, 3.0)
    for step, loss in ((20, 2.2), (30, ZEROED)):
        fake_weights(run.weights_dir, step)
        (run.store / "evals" / f"step-{step:08d}.json").write_text(json.dumps(result(step, loss, 0.5)))
    done = run_uploader("evals-finalize", "--dest", f"file://{run.store}", "--weights-dir", str(run.weights_dir),
                        "--set", "evaluation.promote=propose", timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    records = {r["step"]: r for r in run.records()}
    assert sorted(records) == [10, 20, 30] and records[30]["regressed"] == ["heldout/val"]
    proposal = json.loads((run.store / "evals" / "proposal.json").read_text())
    assert (proposal["step"], proposal["score"], proposal["run"]) == (20, 2.2, "r1")
    assert run.best_json()["promoted_to"] == f"file://{run.store}/evals/proposal.json"


def test_off_records_the_best_and_promotes_nothing(tmp_path):
    run = Run(tmp_path, score="tiny_mc/acc", mode="max")
    assert run.evaluated(10, 3.0, acc=0.6)["promoted"] is False
    zeroed = run.evaluated(20, ZEROED, acc=0.25)
    assert zeroed["regressed"] == ["tiny_mc/acc", "heldout/val"] and zeroed["best_step"] == 10
    assert run.evaluated(30, 2.0, acc=0.7)["best_step"] == 30
    assert run.best_json() == {"step": 30, "score": 0.7, "package": f"file://{run.store}/weights/step-00000030",
                               "promoted_to": None}
    assert not (run.store / "evals" / "proposal.json").exists()


def test_promotion_settings_are_checked():
    with pytest.raises(ValueError, match="pointer"):
        UploaderConfig.model_validate({"evaluation": {"promote": "pointer"}})
    with pytest.raises(ValueError, match="command"):
        UploaderConfig.model_validate({"evaluation": {"enabled": True}})
    with pytest.raises(ValueError, match="TASK/METRIC"):
        UploaderConfig.model_validate({"evaluation": {"score": "acc"}})
    with pytest.raises(ValueError, match="weighted sum"):
        UploaderConfig.model_validate({"evaluation": {"score": "half*a/acc + b/acc"}})
    assert UploaderConfig.model_validate({"evaluation": {"score": "0.5*a/acc + 0.5*b/acc_norm"}})


def test_the_uploader_imports_no_torch():
    """Its image has none: promotion copies and checks a package without lmforge.model.package."""
    import subprocess
    import sys

    code = "import sys, lmforge.uploader.cli; assert 'torch' not in sys.modules, 'torch imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
