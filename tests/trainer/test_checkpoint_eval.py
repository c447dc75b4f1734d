"""`lmforge-train eval-checkpoint` on a tiny Llama-style package (briefly trained, one per module) with two
held-out data sources and the multiple-choice task in tests/fixtures/eval_tasks:

- the held-out loss per source equals a direct forward pass over the same val windows;
- the task scores equal lm-evaluation-harness's own `hf` backend on the same model exported to
  Hugging Face format (per-choice loglikelihoods, acc, and whole-text rolling loglikelihoods; 1e-4);
  the `hf` backend needs `accelerate` (requirements-dev.txt), the job itself neither it nor transformers;
- a zeroed package scores a higher held-out loss (ln V: uniform); the pushed series (a real Pushgateway)
  carry the best-so-far over the results of steps up to the job's own, and a job that finishes after a
  later step's does not overwrite its push;
- the same job with package, data, task directory and result in S3 (moto);
- exit codes: a missing package 3, bad flags 2, a generation task 2."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from lmforge.model.config import GPTConfig
from lmforge.model.hf_package import write_hf_package
from lmforge.model.package import load_package, write_package
from lmforge.model.transformer import GPT
from lmforge.sample_data.token_shards import write_output
from lmforge.trainer import checkpoint_eval
from lmforge.trainer.checkpoint_eval import PUSH_JOB, best_so_far, build_registry, run_tasks, val_source
from lmforge.trainer.cli import main as cli
from lmforge.trainer.data import ShardSource
from lmforge.trainer.lm_eval_backend import LmforgeLM
from tests.conftest import FIXTURES
from tests.prometheus_tools import pushed_value, running_pushgateway
from tests.s3_server import upload_tree
from tests.serving import train_tokenizer

TASKS = FIXTURES / "eval_tasks"
TASK = "lmforge_tiny_mc"
MAX_SEQUENCES = 5
RUN = "tiny-run"
HF_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


@contextlib.contextmanager
def harness_env(scratch):
    """The harness offline with its caches in `scratch`, as the job sets them; restored afterwards."""
    with pytest.MonkeyPatch.context() as patch:
        for name in HF_ENV:
            patch.setenv(name, "1")
        patch.setenv("HF_HOME", str(scratch / "hf"))
        yield


def tiny_package(root, tokenizer, model: GPT, step: int, tokens: int):
    path = write_package(model, tokenizer, root / f"step-{step:08d}", step=step)
    (path / "meta.json").write_text(json.dumps({"step": step, "tokens": tokens, "run": RUN, "final": False}))
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tokenizer, two data-prep outputs of it (val shards of different token statistics), a random
    model as a package (step 10), the same model zeroed (step 20) and the first exported to HF format."""
    root = tmp_path_factory.mktemp("checkpoint-eval")
    tokenizer = train_tokenizer(root / "tokenizer.json", vocab_size=300)
    vocab = Tokenizer.from_file(str(tokenizer)).get_vocab_size()
    sha = hashlib.sha256(tokenizer.read_bytes()).hexdigest()
    rng = np.random.default_rng(0)
    data = {}
    streams = {"web": np.resize(rng.integers(1, vocab, 97), 2_000), "code": rng.integers(1, 40, 2_000)}
    for name, tokens in streams.items():
        data[name] = write_output(root / name, {"train": [tokens], "val": [tokens[:700]]}, vocab_size=vocab,
                                  tokenizer_sha=sha)
    config = GPTConfig(vocab_size=vocab, context_length=64, n_layer=2, n_head=4, n_kv_head=2, n_embd=64,
                       norm="rmsnorm", mlp="swiglu", multiple_of=32)
    torch.manual_seed(0)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    windows = torch.from_numpy(np.stack([tokens[i:i + 65] for tokens in streams.values()
                                         for i in range(0, 1_900, 50)]).astype(np.int64))
    for step in range(40):  # better than uniform on both sources
        batch = windows[torch.arange(step * 16, step * 16 + 16) % len(windows)]
        _, loss = model(batch[:, :-1], batch[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    weights = root / "dest" / "weights"
    good = tiny_package(weights, tokenizer, model, 10, 10 * 4 * 64)
    zeroed_model = GPT(config)
    with torch.no_grad():
        for param in zeroed_model.parameters():
            param.zero_()
    zeroed = tiny_package(weights, tokenizer, zeroed_model, 20, 20 * 4 * 64)
    hf = write_hf_package(model, tokenizer, root / "hf", step=10)
    return {"root": root, "data": data, "good": good, "zeroed": zeroed, "hf": hf, "evals": root / "dest" / "evals"}


def job(world, package, step, *extra):
    args = ["eval-checkpoint", "--package", str(package), "--step", str(step),
            "--out", str(world["evals"] / f"step-{step:08d}.json"), "--max-sequences", str(MAX_SEQUENCES),
            "--run", RUN, *(f"--data={name}={path}" for name, path in world["data"].items()), *extra]
    with harness_env(world["root"]):
        return cli(args)


@pytest.fixture(scope="module")
def pushed(world):
    """Jobs of steps 20 (zeroed) and then 10 (good, tasks too) against one Pushgateway: a later step first,
    as jobs running at once may finish. Returns each job's exit code, result, and what the gateway holds
    after each."""
    with running_pushgateway() as url:
        codes = {20: job(world, world["zeroed"], 20, "--pushgateway", url)}
        after_20 = {source: pushed_value(url, "lmforge_eval_heldout_loss", job=PUSH_JOB, run=RUN, source=source)
                    for source in world["data"]}
        codes[10] = job(world, world["good"], 10, "--tasks", str(TASKS), "--pushgateway", url)
        after_10 = {name: pushed_value(url, name, job=PUSH_JOB, run=RUN)
                    for name in ("lmforge_eval_checkpoint_step", "lmforge_eval_checkpoint_tokens")}
    results = {step: json.loads((world["evals"] / f"step-{step:08d}.json").read_text()) for step in (10, 20)}
    return {"codes": codes, "results": results, "after_20": after_20, "after_10": after_10}


@torch.no_grad()
def direct_loss(package, data) -> float:
    """Mean cross-entropy of the first MAX_SEQUENCES windows, one forward pass over all of them."""
    model, _ = load_package(package)
    source = ShardSource(data, "val", model.config.context_length)
    batch = torch.from_numpy(np.stack([source.sequence(i) for i in range(MAX_SEQUENCES)]))
    logits, _ = model(batch[:, :-1])
    return float(F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten()))


def test_result_holds_the_contracts_fields(world, pushed):
    assert pushed["codes"] == {20: 0, 10: 0}
    result = pushed["results"][10]
    assert {"step", "tokens", "package", "heldout", "tasks", "seconds"} <= set(result)
    assert (result["step"], result["tokens"], result["package"]) == (10, 10 * 4 * 64, str(world["good"]))
    assert set(result["heldout"]) == {"web", "code"}
    assert set(result["tasks"]) == {TASK} and "acc" in result["tasks"][TASK]
    assert pushed["results"][20]["tasks"] == {}  # no --tasks: held-out only


def test_heldout_loss_per_source_equals_a_direct_forward_pass(world, pushed):
    for name, data in world["data"].items():
        heldout = pushed["results"][10]["heldout"][name]
        assert heldout["loss"] == pytest.approx(direct_loss(world["good"], data), abs=1e-5)
        assert heldout["perplexity"] == pytest.approx(math.exp(heldout["loss"]))
    losses = {name: v["loss"] for name, v in pushed["results"][10]["heldout"].items()}
    assert losses["web"] != pytest.approx(losses["code"])  # the sources are scored apart


def test_a_zeroed_package_scores_a_higher_heldout_loss(world, pushed):
    for name in world["data"]:
        zeroed = pushed["results"][20]["heldout"][name]["loss"]
        assert zeroed == pytest.approx(math.log(vocab_size(world)), abs=1e-5)  # all logits 0: uniform
        assert zeroed > pushed["results"][10]["heldout"][name]["loss"]


def vocab_size(world) -> int:
    return json.loads((world["good"] / "config.json").read_text())["model"]["vocab_size"]


def test_task_scores_equal_the_hf_backend(world, pushed):
    import lm_eval
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    with harness_env(world["root"]):
        ours_lm = LmforgeLM.from_package(world["good"], batch_size=4)
        ours, ours_raw = run_tasks(ours_lm, TASKS, log_samples=True)
        hf_lm = HFLM(pretrained=str(world["hf"]), dtype="float32", device="cpu", batch_size=3)
        previous = os.getcwd()
        os.chdir(TASKS)  # the task's data_files are relative to its folder
        try:
            theirs = lm_eval.simple_evaluate(
                model=hf_lm, tasks=[TASK], task_manager=TaskManager(include_path=str(TASKS), include_defaults=False),
                log_samples=True, bootstrap_iters=0)
        finally:
            os.chdir(previous)
    # Whole-text loglikelihoods (perplexity tasks): one window, and several (longer than the context).
    texts = ["Bees make honey from the nectar.", " ".join(["The capital of France is Paris."] * 12)]
    assert len(ours_lm.tok_encode(texts[1])) > 2 * ours_lm.max_length
    requests = [Instance("loglikelihood_rolling", {}, (text,), i) for i, text in enumerate(texts)]
    mine_rolling, hf_rolling = ours_lm.loglikelihood_rolling(requests), hf_lm.loglikelihood_rolling(requests)
    assert mine_rolling == pytest.approx(hf_rolling, abs=1e-4)

    def loglikelihoods(raw):
        return {s["doc_id"]: [float(r[0][0]) for r in s["resps"]] for s in raw["samples"][TASK]}

    mine, hf = loglikelihoods(ours_raw), loglikelihoods(theirs)
    assert sorted(mine) == sorted(hf) == list(range(6))
    for doc in mine:
        assert mine[doc] == pytest.approx(hf[doc], abs=1e-4), doc
    assert ours[TASK]["acc"] == pytest.approx(theirs["results"][TASK]["acc,none"], abs=1e-4)
    assert pushed["results"][10]["tasks"][TASK]["acc"] == pytest.approx(ours[TASK]["acc"], abs=1e-4)
    spread = [max(v) - min(v) for v in mine.values()]
    assert min(spread) > 1e-3  # the choices' scores differ: acc is no tie-break artefact


def test_pushed_series_carry_best_so_far_whatever_the_finish_order(world, pushed):
    # Step 20 (zeroed) finished first: it pushed its own loss, and the best over steps ≤ 20 is step 10's
    # only once step 10's result exists; step 10 finished later and found a later result: no push.
    for name in world["data"]:
        assert pushed["after_20"][name] == pytest.approx(pushed["results"][20]["heldout"][name]["loss"])
    assert pushed["after_10"] == {"lmforge_eval_checkpoint_step": 20.0,
                                  "lmforge_eval_checkpoint_tokens": 20.0 * 4 * 64}
    # The same series, recomputed from the store in finish order 10 then 20 (as a rerun of step 20 does now).
    stored = list(pushed["results"].values())
    best = best_so_far(pushed["results"][20], stored)
    assert not best.newer_exists
    assert best.heldout_losses == {name: pushed["results"][10]["heldout"][name]["loss"] for name in world["data"]}
    assert best.task_scores == {(TASK, "acc"): pushed["results"][10]["tasks"][TASK]["acc"]}
    assert best_so_far(pushed["results"][10], stored).newer_exists
    registry = build_registry(pushed["results"][20], best)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for family in registry.collect()
               for s in family.samples}
    for name in world["data"]:
        loss, best_loss = (samples[(metric, (("source", name),))] for metric in
                           ("lmforge_eval_heldout_loss", "lmforge_eval_heldout_best_loss"))
        assert loss - best_loss > 0.5  # what LmforgeEvalHeldOutRegression fires on
    assert samples[("lmforge_eval_task_best_score", (("metric", "acc"), ("task", TASK)))] == \
        pushed["results"][10]["tasks"][TASK]["acc"]
    assert samples[("lmforge_eval_checkpoint_step", ())] == 20


def test_rerun_of_the_latest_step_pushes_the_best_so_far(world):
    with running_pushgateway() as url:
        assert job(world, world["zeroed"], 20, "--pushgateway", url) == 0
        for name in world["data"]:
            best = pushed_value(url, "lmforge_eval_heldout_best_loss", job=PUSH_JOB, run=RUN, source=name)
            assert best == pytest.approx(direct_loss(world["good"], world["data"][name]), abs=1e-5)


def test_packages_data_and_results_in_s3(world, s3):
    """The job as it runs in a cluster: package, data and result in the object store."""
    from lmforge.common.storage import open_store

    _, make_bucket = s3
    client = make_bucket("evals")
    upload_tree(client, "evals", world["good"], "run/weights/step-00000010")
    upload_tree(client, "evals", world["data"]["code"], "data/code")
    upload_tree(client, "evals", TASKS, "tasks")  # a task directory kept in object storage
    out = "s3://evals/run/evals/step-00000010.json"
    assert cli(["eval-checkpoint", "--package", "s3://evals/run/weights/step-00000010", "--step", "10",
                "--out", out, "--data", "code=s3://evals/data/code", "--max-sequences", str(MAX_SEQUENCES),
                "--tasks", "s3://evals/tasks"]) == 0
    result = json.loads(open_store("s3://evals/run/evals").read_bytes("step-00000010.json"))
    assert 0 <= result["tasks"]["lmforge_tiny_mc"]["acc"] <= 1
    assert result["tokens"] == 10 * 4 * 64
    assert result["heldout"]["code"]["loss"] == pytest.approx(direct_loss(world["good"], world["data"]["code"]),
                                                              abs=1e-5)
    assert [r["step"] for r in checkpoint_eval.stored_results(out)] == [10]


def test_val_source_reads_a_data_source(world):
    source = val_source(str(world["data"]["web"]), world["root"] / "unused", 64, "web")
    assert source.name == "web" and source.num_sequences == (700 - 1) // 64


def test_exit_codes(world, tmp_path, capsys):
    assert job(world, tmp_path / "no-such-package", 30) == 3
    assert "no such package" in capsys.readouterr().err
    assert cli(["eval-checkpoint", "--package", str(world["good"]), "--step", "1", "--out",
                str(tmp_path / "step-1.json"), "--data", "=nowhere"]) == 2
    assert cli(["eval-checkpoint", "--package", str(world["good"]), "--step", "1",
                "--out", str(tmp_path / "result.txt"), "--data", f"web={world['data']['web']}"]) == 2
    with pytest.raises(SystemExit) as exited:
        cli(["eval-checkpoint", "--package", str(world["good"]), "--out", str(tmp_path / "x.json")])  # no --step
    assert exited.value.code == 2


def test_generation_tasks_are_refused(world, tmp_path):
    (tmp_path / "gen.yaml").write_text((TASKS / "tiny_mc.yaml").read_text().replace(
        "task: lmforge_tiny_mc", "task: lmforge_tiny_gen").replace("output_type: multiple_choice",
                                                                   "output_type: generate_until").replace(
        "tiny_mc.jsonl", str(TASKS / "tiny_mc.jsonl")).replace('doc_to_choice: "{{choices}}"\n', "").replace(
        '"{{answer}}"', '"{{choices[answer]}}"'))
    with harness_env(world["root"]):
        assert cli(["eval-checkpoint", "--package", str(world["good"]), "--step", "1", "--tasks", str(tmp_path),
                    "--out", str(tmp_path / "out" / "step-1.json")]) == 2
    assert checkpoint_eval.metric_name("acc_stderr,none") is None
