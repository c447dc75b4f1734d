"""The model package's chat template: tokenizer_config.json's `chat_template` beside the
tokenizer (or a chat_template.jinja file, where newer transformers write it), rendered as
transformers' apply_chat_template renders it: Jinja2 in a sandbox, trim_blocks and
lstrip_blocks, `raise_exception`, `tojson` and `strftime_now`, the special tokens as variables,
and `add_generation_prompt` true (the prompt ends where the assistant's answer begins)."""

from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

TEMPLATE_FILE = "chat_template.jinja"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class ChatTemplateError(ValueError):
    """The template refused the messages (raise_exception) or failed to render."""


def _token(value: Any) -> str | None:
    if isinstance(value, dict):  # an AddedToken written out: {"content": ..., ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str]):
        self.source, self.special_tokens = source, special_tokens

    @classmethod
    def beside(cls, tokenizer_path: Path) -> ChatTemplate | None:
        """The template of the tokenizer at `tokenizer_path`, or None where it has none."""
        config_path = tokenizer_path.with_name("tokenizer_config.json")
        try:
            config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        except ValueError:
            config = {}
        config = config if isinstance(config, dict) else {}
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        template_file = tokenizer_path.with_name(TEMPLATE_FILE)
        if template_file.is_file():
            source = template_file.read_text(encoding="utf-8")
        if not isinstance(source, str) or not source.strip():
            return None
        tokens = {name: token for name in SPECIAL_TOKENS if (token := _token(config.get(name))) is not None}
        return cls(source, tokens)

    @cached_property
    def _compiled(self):
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise ChatTemplateError(message)

        def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)  # noqa: DTZ005 - as transformers
        return env.from_string(self.source)

    def render(self, messages: list[dict[str, Any]]) -> str:
        from jinja2 import TemplateError

        try:
            return self._compiled.render(messages=messages, add_generation_prompt=True, **self.special_tokens)
        except ChatTemplateError:
            raise
        except TemplateError as exc:
            raise ChatTemplateError(f"the chat template failed: {exc}") from exc
