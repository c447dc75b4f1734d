"""The serving package in Hugging Face format (`lmforge-train export --format hf`): a directory
transformers loads with `AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained`
(no custom code), and lmforge-serve, the canary and `model.init_from` load as well:

    model.safetensors         the weights under transformers' names (lmforge.model.hf_weights)
    config.json               transformers' config (lmforge.model.hf_config) plus an `lmforge`
                              block: {"format_version", "step", "tokenizer_sha256", "files"}, the
                              same checks as the lmforge format's config.json
    generation_config.json    BOS/EOS = end-of-text
    tokenizer.json            the data-prep tokenizer, byte for byte
    tokenizer_config.json, special_tokens_map.json   (lmforge.model.hf_tokenizer)

Reading accepts any transformers checkpoint of a supported architecture, including ones
without the `lmforge` block (a third-party model: nothing to verify the files against) and
with sharded weights (model.safetensors.index.json).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from lmforge.common.atomic_files import atomic_dir, chmod_as_plain_write
from lmforge.common.errors import InputError, StorageError
from lmforge.common.storage import sha256_file
from lmforge.model import hf_config, hf_tokenizer
from lmforge.model.config import GPTConfig

FORMAT_VERSION = 1  # of the `lmforge` block; the same checks as model_package's format 1
WEIGHTS, WEIGHTS_INDEX, CONFIG, TOKENIZER = (
    "model.safetensors",
    "model.safetensors.index.json",
    "config.json",
    "tokenizer.json",
)
GENERATION_CONFIG = "generation_config.json"
BLOCK = "lmforge"


def is_hf_config(meta: Any) -> bool:
    """config.json is transformers' (it names a model_type), not the lmforge format's."""
    return isinstance(meta, dict) and "model_type" in meta and "format_version" not in meta


def write_hf_package(
    model, tokenizer: str | Path, output: str | Path, *, step: int, eos_token: str = hf_tokenizer.DEFAULT_EOS
) -> Path:
    """Write `model` (a GPT) as a transformers model directory, staged beside `output` and
    renamed into place. A model no transformers architecture computes exactly is refused with
    a ConfigError before anything is written."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    from lmforge.model.hf_weights import to_hf_state

    tokenizer, output = Path(tokenizer), Path(output)
    config: GPTConfig = model.config
    model_type = hf_config.hf_model_type(config)
    state = to_hf_state(model.state_dict(), config, model_type)
    eos_id = hf_tokenizer.token_id(tokenizer, eos_token)
    dtype = str(next(iter(state.values())).dtype).removeprefix("torch.")
    with atomic_dir(output) as staging:
        try:
            save_file(state, str(staging / WEIGHTS), metadata={"format": "pt"})
        except SafetensorError as exc:  # its I/O errors (disk full) are not OSErrors
            raise StorageError(f"cannot write {output / WEIGHTS}: {exc}") from exc
        chmod_as_plain_write(staging / WEIGHTS)  # safetensors makes it 0600: servers run as another user
        shutil.copyfile(tokenizer, staging / TOKENIZER)
        _write_json(
            staging / hf_tokenizer.TOKENIZER_CONFIG, hf_tokenizer.tokenizer_config(eos_token, config.context_length)
        )
        _write_json(staging / hf_tokenizer.SPECIAL_TOKENS_MAP, hf_tokenizer.special_tokens_map(eos_token))
        _write_json(staging / GENERATION_CONFIG, hf_config.generation_config(eos_id))
        block = {
            "format_version": FORMAT_VERSION,
            "step": step,
            "tokenizer_sha256": hashlib.sha256(tokenizer.read_bytes()).hexdigest(),
            "files": {
                name: {"sha256": sha256_file(staging / name), "bytes": (staging / name).stat().st_size}
                for name in (WEIGHTS, TOKENIZER)
            },
        }
        _write_json(
            staging / CONFIG, {**hf_config.to_hf_config(config, eos_token_id=eos_id, dtype=dtype), BLOCK: block}
        )
    return output


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def verify_hf_package(path: Path, meta: dict, *, require_checksums: bool = False) -> dict:
    """model_package.verify_package for a transformers directory whose config.json is `meta`:
    the files are there, the architecture maps, and (where the `lmforge` block records them)
    the tokenizer and weights match their checksums. Returns the package's description in the
    lmforge format's terms: {"format": "hf", "model", "step", "tokenizer_sha256", "files", "hf_config"}."""
    for name in (CONFIG, TOKENIZER):
        if not (path / name).is_file():
            raise InputError(f"{path}: not a model package ({name} missing)")
    if not (path / WEIGHTS).is_file() and not (path / WEIGHTS_INDEX).is_file():
        raise InputError(f"{path}: not a model package (neither {WEIGHTS} nor {WEIGHTS_INDEX})")
    model = hf_config.from_hf_config(meta)
    block = meta.get(BLOCK) if isinstance(meta.get(BLOCK), dict) else {}
    if block and block.get("format_version") != FORMAT_VERSION:
        raise InputError(f"{path}: unsupported lmforge block format {block.get('format_version')!r} in config.json")
    tokenizer_sha = hashlib.sha256((path / TOKENIZER).read_bytes()).hexdigest()
    if "tokenizer_sha256" in block and tokenizer_sha != block["tokenizer_sha256"]:
        raise InputError(f"{path}: tokenizer.json does not match the hash the model was trained with")
    files = block.get("files")
    if files is None and require_checksums:
        raise InputError(
            f"{path}: config.json has no lmforge file checksums (not exported by lmforge-train export --format hf)"
        )
    for name, expected in (files or {}).items():
        if not isinstance(expected, dict) or not {"sha256", "bytes"} <= set(expected):
            raise InputError(f"{path / CONFIG}: no checksum of {name} in lmforge.files")
        if not (path / name).is_file():
            raise InputError(f"{path}: {name} missing")
        if (path / name).stat().st_size != expected["bytes"]:
            raise InputError(
                f"{path / name}: {(path / name).stat().st_size} bytes, config.json records {expected['bytes']}"
            )
        if sha256_file(path / name) != expected["sha256"]:
            raise InputError(f"{path / name}: sha256 does not match config.json (corrupt or replaced)")
    return {
        "format": "hf",
        "model": model.model_dump(),
        "step": block.get("step"),
        "tokenizer_sha256": tokenizer_sha,
        "files": files,
        "hf_config": meta,
    }


def read_hf_state(path: Path, meta: dict) -> tuple[GPTConfig, dict]:
    """The GPTConfig and our state_dict of the transformers directory `path` (config.json
    `meta`, verified). GPT-2 and GPT-NeoX always store biases: all zero, they are dropped and the
    config says bias: false."""
    from lmforge.model.hf_weights import biases_are_zero, from_hf_state, without_biases

    config = hf_config.from_hf_config(meta)
    state = from_hf_state(_read_tensors(path), config, meta["model_type"])
    if meta["model_type"] in ("gpt2", "gpt_neox") and biases_are_zero(state):
        config, state = config.model_copy(update={"bias": False}), without_biases(state)
    return config, state


def _read_tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    if (path / WEIGHTS).is_file():
        return load_file(str(path / WEIGHTS), device="cpu")
    try:
        weight_map = json.loads((path / WEIGHTS_INDEX).read_text())["weight_map"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise InputError(f"{path / WEIGHTS_INDEX}: not a safetensors index ({exc})") from exc
    tensors: dict = {}
    for shard in sorted(set(weight_map.values())):
        if Path(shard).name != shard:
            raise InputError(f"{path / WEIGHTS_INDEX}: shard {shard!r} is not a file name in the directory")
        tensors.update(load_file(str(path / shard), device="cpu"))
    return tensors
