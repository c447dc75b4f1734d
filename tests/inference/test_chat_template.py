"""The chat template is found where transformers looks (tokenizer_config.json's `chat_template`,
named templates, chat_template.jinja) and renders exactly as transformers' apply_chat_template."""

from __future__ import annotations

import json
import shutil

import pytest
from transformers import AutoTokenizer

from lmforge.inference.chat_template import ChatTemplate, ChatTemplateError

TEMPLATE = ("{% if messages[0]['role'] != 'system' %}{{ raise_exception('the first message must be system') }}"
            "{% endif %}{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content | tojson }}\n"
            "{% if loop.index > 2 %}{% break %}{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
MESSAGES = [{"role": "system", "content": "Be \"brief\"."}, {"role": "user", "content": "Grüße"},
            {"role": "assistant", "content": "Hallo"}, {"role": "user", "content": "dropped by the break"}]


def package_with(tiny_package, folder, **config):
    folder.mkdir()
    shutil.copy(tiny_package / "tokenizer.json", folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        **config}))
    return folder


def test_renders_as_transformers_does(tiny_package, tmp_path):
    folder = package_with(tiny_package, tmp_path / "inline", chat_template=TEMPLATE)
    ours = ChatTemplate.beside(folder / "tokenizer.json").render(MESSAGES)
    theirs = AutoTokenizer.from_pretrained(folder).apply_chat_template(MESSAGES, tokenize=False,
                                                                       add_generation_prompt=True)
    assert ours == theirs == ('<|endoftext|><system>"Be \\"brief\\"."\n<user>"Grüße"\n<assistant>"Hallo"\n'
                              '<assistant>')
    with pytest.raises(ChatTemplateError, match="the first message must be system"):
        ChatTemplate.beside(folder / "tokenizer.json").render(MESSAGES[1:])


def test_named_templates_and_the_jinja_file(tiny_package, tmp_path):
    named = package_with(tiny_package, tmp_path / "named",
                         chat_template=[{"name": "tool_use", "template": "tools"}, {"name": "default",
                                                                                    "template": TEMPLATE}])
    assert ChatTemplate.beside(named / "tokenizer.json").source == TEMPLATE
    separate = package_with(tiny_package, tmp_path / "file")
    (separate / "chat_template.jinja").write_text(TEMPLATE)
    assert ChatTemplate.beside(separate / "tokenizer.json").source == TEMPLATE
    assert ChatTemplate.beside(package_with(tiny_package, tmp_path / "none") / "tokenizer.json") is None
    assert ChatTemplate.beside(tiny_package / "tokenizer.json") is None  # no tokenizer_config.json at all
