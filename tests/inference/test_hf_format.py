"""One artifact serves everywhere: the memorizing tiny model written in Hugging Face format
(`export --format hf`) is served by lmforge-serve with the same completions as its lmforge
package, and transformers' own generate() on that directory continues the same way."""

from __future__ import annotations

import pytest
import torch
from starlette.testclient import TestClient
from transformers import AutoModelForCausalLM, AutoTokenizer

from lmforge.inference.api import create_app
from lmforge.inference.config import ServeConfig
from lmforge.inference.service import InferenceService
from lmforge.model.hf_package import write_hf_package
from lmforge.model.package import load_package

PROMPTS = {"Bees make": " honey from the nectar of flowers.", "The capital of France": " is Paris"}


@pytest.fixture(scope="module")
def hf_package(tiny_package, tmp_path_factory):
    model, meta = load_package(tiny_package)
    return write_hf_package(
        model, tiny_package / "tokenizer.json", tmp_path_factory.mktemp("hf") / "tiny-hf", step=meta["step"]
    )


def greedy_completions(package) -> dict[str, str]:
    service = InferenceService(ServeConfig(model=str(package)))
    try:
        with TestClient(create_app(service)) as client:
            service.load()
            assert client.get("/readyz").json()["status"] == "ready", service.load_error
            return {
                prompt: client.post(
                    "/v1/completions", json={"prompt": prompt, "max_tokens": 30, "temperature": 0}
                ).json()["choices"][0]["text"]
                for prompt in PROMPTS
            }
    finally:
        service.stop()


def test_lmforge_serve_gives_the_same_completions_from_the_hf_format(tiny_package, hf_package):
    served = greedy_completions(hf_package)
    assert served == greedy_completions(tiny_package)
    for prompt, expected in PROMPTS.items():
        assert served[prompt].startswith(expected)


def test_transformers_generate_on_the_same_directory_continues_the_same(hf_package):
    tokenizer = AutoTokenizer.from_pretrained(hf_package)
    model = AutoModelForCausalLM.from_pretrained(hf_package).eval()
    for prompt, expected in PROMPTS.items():
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            output = model.generate(ids, max_new_tokens=30, do_sample=False)
        assert tokenizer.decode(output[0, ids.shape[1] :], skip_special_tokens=True).startswith(expected)
