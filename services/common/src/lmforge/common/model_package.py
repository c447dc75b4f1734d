"""The serving package `lmforge-train export` writes and inference loads (DESIGN.md):

    model.safetensors   consolidated weights (the tied output head is not stored twice)
    config.json         {"model": GPTConfig fields, "tokenizer_sha256", "step", "format_version"}
    tokenizer.json

Weights are read with safetensors only: nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from lmforge.common.errors import InputError
from lmforge.common.model import GPT, GPTConfig

FORMAT_VERSION = 1
WEIGHTS, CONFIG, TOKENIZER = "model.safetensors", "config.json", "tokenizer.json"
TIED = "lm_head.weight"


def package_state(model: GPT) -> dict:
    return {name: tensor.detach().contiguous().cpu() for name, tensor in model.state_dict().items() if name != TIED}


def load_package(path: str | Path, device: str = "cpu") -> tuple[GPT, dict]:
    """The model (eval mode) and the package's config.json; checks the tokenizer hash."""
    from safetensors.torch import load_file

    path = Path(path)
    for name in (WEIGHTS, CONFIG, TOKENIZER):
        if not (path / name).is_file():
            raise InputError(f"{path}: not a model package ({name} missing)")
    meta = json.loads((path / CONFIG).read_text())
    if meta.get("format_version") != FORMAT_VERSION:
        raise InputError(f"{path}: unsupported package format {meta.get('format_version')!r}")
    if hashlib.sha256((path / TOKENIZER).read_bytes()).hexdigest() != meta["tokenizer_sha256"]:
        raise InputError(f"{path}: tokenizer.json does not match the hash the model was trained with")
    model = GPT(GPTConfig.model_validate(meta["model"]))
    state = load_file(str(path / WEIGHTS), device="cpu")
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {TIED}:
        raise InputError(f"{path}: weights do not fit the config (missing {missing}, unexpected {unexpected})")
    return model.to(device).eval(), meta
