"""lm-evaluation-harness's `local-completions` model against a real lmforge-serve, on a small
multiple-choice task defined here (a JSONL file and a task YAML): it sends token-id batches with
`echo`, `logprobs` and `max_tokens` 1, and every choice's loglikelihood it computes must equal
the model's own (one forward pass over the same token ids) within 1e-4."""

from __future__ import annotations

import json

import pytest
import torch

from lmforge.inference.text import Codec
from lmforge.model.package import load_package
from tests.serving import running_server

KEY = "sk-harness"  # noqa: S105 - a test server's key
QUESTIONS = [
    {"question": "Bees make", "choices": ["honey from the nectar", "bread from the wheat", "rain"], "answer": 0},
    {"question": "The capital of France is", "choices": ["Rome", "Paris"], "answer": 1},
    {"question": "A week has seven", "choices": ["days", "months", "roses and tulips"], "answer": 0},
    {"question": "Grüße aus", "choices": ["München", "Paris"], "answer": 0},
]
TASK = """task: lmforge_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lm-eval-task")
    data = folder / "questions.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    (folder / "lmforge_tiny_mc.yaml").write_text(TASK.format(data=data))
    return folder


@torch.no_grad()
def direct_loglikelihood(model, codec: Codec, context: str, continuation: str) -> float:
    """The continuation's logprob given the context, from one forward pass; the tokens split as
    the harness splits them (the whole text's tokens after the context's)."""
    context_ids, whole = codec.encode(context), codec.encode(context + continuation)
    logits, _ = model(torch.tensor([whole]))
    logprobs = torch.log_softmax(logits[0, :-1].float(), dim=-1)
    targets = torch.tensor(whole[1:])
    return float(logprobs.gather(1, targets[:, None]).squeeze(1)[len(context_ids) - 1:].sum())


def test_local_completions_loglikelihoods_equal_the_models_own(chat_package, task_dir, tmp_path, monkeypatch):
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")  # nothing downloaded: the task's data and the tokenizer are local
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # what local-completions sends as its bearer token
    import lm_eval
    from lm_eval.tasks import TaskManager

    keys = tmp_path / "api-keys"
    keys.write_text(KEY + "\n")
    with running_server(chat_package, f"api_keys_file={keys}") as url:
        results = lm_eval.simple_evaluate(
            model="local-completions",
            model_args=f"model=tiny-chat,base_url={url}/v1/completions,tokenizer_backend=huggingface,"
                       f"tokenizer={chat_package},max_length=96,batch_size=3,max_retries=1",
            tasks=["lmforge_tiny_mc"], task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
            log_samples=True)

    samples = results["samples"]["lmforge_tiny_mc"]
    assert len(samples) == len(QUESTIONS)
    model, _ = load_package(chat_package)
    codec = Codec(chat_package / "tokenizer.json")
    for sample in samples:
        question = QUESTIONS[sample["doc_id"]]
        harness = [float(ll) for (ll, _greedy) in (r[0] for r in sample["resps"])]
        direct = [direct_loglikelihood(model, codec, question["question"], " " + c) for c in question["choices"]]
        assert harness == pytest.approx(direct, abs=1e-4), question
    assert results["results"]["lmforge_tiny_mc"]["acc,none"] == 1.0  # the memorized answers are the likeliest
