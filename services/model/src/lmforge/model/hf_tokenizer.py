"""The tokenizer side of a Hugging Face model directory: tokenizer_config.json and
special_tokens_map.json beside the data-prep tokenizer.json, so that `AutoTokenizer` loads it
as a plain fast tokenizer (no custom code, no Llama/GPT-2 class re-deriving the pipeline) that
encodes exactly as the trainer's data did: no BOS or EOS added, nothing normalized.

The end-of-text token that closes every training document is EOS, and BOS too (GPT-2's
convention): a tool that needs a first token for an empty context (lm-evaluation-harness's
loglikelihood) then uses what the model saw before every document.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmforge.common.errors import InputError

TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP = "tokenizer_config.json", "special_tokens_map.json"
DEFAULT_EOS = "<|endoftext|>"  # noqa: S105 - the data-prep tokenizer's end-of-text token


def token_id(tokenizer_json: Path, token: str) -> int:
    """The id of `token` in tokenizer.json (an added/special token, or the model's vocabulary)."""
    spec = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))
    for added in spec.get("added_tokens") or []:
        if added.get("content") == token:
            return int(added["id"])
    vocab = (spec.get("model") or {}).get("vocab")
    if isinstance(vocab, dict) and token in vocab:
        return int(vocab[token])
    raise InputError(f"{tokenizer_json}: the end-of-text token {token!r} is not in the tokenizer")


def tokenizer_config(eos_token: str, context_length: int) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": eos_token,
        "eos_token": eos_token,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context_length,
    }


def special_tokens_map(eos_token: str) -> dict[str, str]:
    return {"bos_token": eos_token, "eos_token": eos_token}
