"""The demo's evaluation branch: what the uploader sidecar needs to run an evaluation job for each
weights-only checkpoint the trainer writes, as the chart's `training.evaluation` sets it up on a
cluster (there with the kubernetes runner; here each job is a subprocess).

The harness task is made from the run's own validation documents, since nothing can be downloaded:
each question is a document's opening words and the choices its true next words and the next words
of two other documents. A model that learned the corpus prefers the true continuation, so the
score moves with training, and a broken (zeroed) checkpoint falls to chance."""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from lmforge.demo.config import TrainSection
from lmforge.demo.processes import StepFailed
from lmforge.demo.prometheus import alerts
from lmforge.demo.scripts import script
from lmforge.demo.stages.serve import validation_documents

TASK = "demo_continuation"
PROMPT_WORDS, CHOICE_WORDS = 12, 4


def write_continuation_task(data_dir: Path, folder: Path, questions: int) -> Path:
    """An lm-evaluation-harness multiple-choice task (YAML + JSONL) in `folder`; returns `folder`."""
    documents = [d.split() for d in validation_documents(data_dir, 4 * questions)]
    usable = [words for words in documents if len(words) >= PROMPT_WORDS + CHOICE_WORDS]
    if len(usable) < 3:
        raise StepFailed(f"the validation split of {data_dir} has too few long documents for the evaluation task")
    rows = []
    for index, words in enumerate(usable[:questions]):
        others = [usable[(index + shift) % len(usable)] for shift in (1, 2)]
        choices = [" ".join(w[PROMPT_WORDS:PROMPT_WORDS + CHOICE_WORDS]) for w in (words, *others)]
        answer = index % len(choices)  # the true continuation's place rotates
        choices.insert(answer, choices.pop(0))
        rows.append({"question": " ".join(words[:PROMPT_WORDS]), "choices": [" " + c for c in choices],
                     "answer": answer})
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{TASK}.jsonl"
    data.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    # data_files relative to the folder (the job runs the harness there): it stays valid once moved
    task = {"task": TASK, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": data.name}},
            "test_split": "test", "output_type": "multiple_choice", "doc_to_text": "{{question}}",
            "doc_to_choice": "{{choices}}", "doc_to_target": "{{answer}}", "metric_list": [{"metric": "acc"}]}
    (folder / f"{TASK}.yaml").write_text(yaml.safe_dump(task, sort_keys=False), encoding="utf-8")
    return folder


RUN = "demo"


def write_uploader_config(path: Path, train: TrainSection, data_dir: Path, tasks: Path, pushgateway: str,
                          s3_endpoint: str) -> Path:
    """The sidecar's evaluation settings (lmforge.uploader.config.EvaluationSection): each uploaded
    weights package gets a `lmforge-train eval-checkpoint` subprocess; the best by held-out loss is
    copied to the store's models/ and the model pointer names it, as the chart's promote.mode=pointer."""
    command = [script("lmforge-train"), "eval-checkpoint", "--data", f"demo={data_dir}", "--tasks", str(tasks),
               "--max-sequences", "16", "--run", RUN, "--endpoint-url", s3_endpoint,
               *(["--pushgateway", pushgateway] if pushgateway else [])]
    config = {"evaluation": {"enabled": True, "max_concurrent": train.eval_max_concurrent, "runner": "subprocess",
                             "command": command, "score": "heldout/loss", "mode": "min", "promote": "pointer",
                             "pointer": pointer_uri(train), "models_store": f"s3://{train.bucket}/models",
                             "run": RUN}}
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def pointer_uri(train: TrainSection) -> str:
    return f"s3://{train.bucket}/models/current"


def last_weights_step(train: TrainSection) -> int | None:
    """The step of the run's last weights package: the trainer always packages its final step."""
    return train.steps - 1 if train.weights_every else None


REGRESSION_ALERT = "LmforgeEvalHeldOutRegression"


def evaluation_summary(outcome) -> dict:
    """What the summary says of the evaluation branch, from the run's records and evals/best.json."""
    records = outcome.checkpoint_evals
    evaluated = [r for r in records if not r.get("skipped") and not r.get("failed")]
    zeroed = next((r for r in evaluated if r["step"] == outcome.zeroed_step), None)
    return {"packages": len(records), "evaluated": [r["step"] for r in evaluated],
            "skipped": [r["step"] for r in records if r.get("skipped")],
            "failed": [r["step"] for r in records if r.get("failed")],
            "scores": {r["step"]: {"heldout": r.get("heldout"), "tasks": r.get("tasks")} for r in evaluated},
            "best_step": outcome.best["step"] if outcome.best else None,
            "promoted_to": outcome.best.get("promoted_to") if outcome.best else None,
            "zeroed_step": outcome.zeroed_step, "zeroed_regressed": bool(zeroed and zeroed.get("regressed")),
            "alert": None}


def evaluation_line(evaluation: dict) -> str:
    skipped = f", {len(evaluation['skipped'])} skipped" if evaluation["skipped"] else ""
    zeroed = (f"; step {evaluation['zeroed_step']} zeroed on purpose: "
              f"{'regressed' if evaluation['zeroed_regressed'] else 'NOT flagged'}"
              if evaluation["zeroed_step"] is not None else "")
    return (f"{len(evaluation['evaluated'])} weights checkpoints evaluated{skipped}; best step "
            f"{evaluation['best_step']} promoted to {evaluation['promoted_to']}{zeroed}")


def wait_for_alert(prometheus: str, name: str, timeout: float) -> bool:
    """Whether alert `name` is firing in Prometheus within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if any(a["labels"].get("alertname") == name and a["state"] == "firing" for a in alerts(prometheus)):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(1)
