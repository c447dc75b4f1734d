from __future__ import annotations

import json
import shutil

import pytest

from tests.serving import CONFIG, running_server, train_tiny_package


@pytest.fixture(scope="session")
def tiny_package(tmp_path_factory):
    """The memorizing tiny model's serving package (trained once per session)."""
    return train_tiny_package(tmp_path_factory.mktemp("models") / "tiny-v1")


@pytest.fixture(scope="session")
def long_context_package(tiny_package, tmp_path_factory):
    """The tiny model with a 65,536-token context: rotary positions make it the same model on
    short prompts, and the context admits a prompt of close to a megabyte by its characters."""
    package = tmp_path_factory.mktemp("models") / "tiny-long"
    shutil.copytree(tiny_package, package)
    meta = json.loads((package / "config.json").read_text())
    assert meta["model"].get("positions", "rope") == "rope"
    meta["model"]["context_length"] = 65536
    (package / "config.json").write_text(json.dumps(meta))
    return package


@pytest.fixture(scope="module")
def server(tiny_package, tmp_path_factory):
    """A default lmforge-serve (at most 4 sequences running), its log file beside it."""
    log = tmp_path_factory.mktemp("server") / "serve.log"
    with running_server(tiny_package, "engine.max_running=4", log_path=log) as url:
        yield url, log


# A tiny chat template: "role: content" lines, then the assistant's turn (Jinja, as transformers reads it).
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture(scope="session")
def chat_package(tiny_package, tmp_path_factory):
    """The tiny model's package with a Hugging Face tokenizer_config.json carrying a chat template
    (as an exported model's tokenizer may): AutoTokenizer loads the directory too."""
    from lmforge.model.hf_tokenizer import DEFAULT_EOS, tokenizer_config

    package = tmp_path_factory.mktemp("models") / "tiny-chat"
    shutil.copytree(tiny_package, package)
    config = {**tokenizer_config(DEFAULT_EOS, CONFIG["context_length"]), "chat_template": CHAT_TEMPLATE}
    (package / "tokenizer_config.json").write_text(json.dumps(config))
    return package
