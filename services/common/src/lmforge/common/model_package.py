"""The serving package `lmforge-train export` writes and inference loads (docs/design.md):

    model.safetensors   consolidated weights (the tied output head is not stored twice)
    config.json         {"model": GPTConfig fields, "tokenizer_sha256", "step", "format_version"}
    tokenizer.json

Weights are read with safetensors only: nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from lmforge.common.errors import InputError, StorageError
from lmforge.common.model import GPT, GPTConfig
from lmforge.common.storage import S3Store, atomic_dir, chmod_as_plain_write, local_path_of, scheme_of

FORMAT_VERSION = 1
WEIGHTS, CONFIG, TOKENIZER = "model.safetensors", "config.json", "tokenizer.json"
TIED = "lm_head.weight"


def package_state(model: GPT) -> dict:
    return {name: tensor.detach().contiguous().cpu() for name, tensor in model.state_dict().items() if name != TIED}


def write_package(model: GPT, tokenizer: str | Path, output: str | Path, *, step: int) -> Path:
    """Write the package into a staging directory beside `output`, then rename it into place:
    a reader never sees half a package."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    tokenizer, output = Path(tokenizer), Path(output)
    with atomic_dir(output) as staging:
        try:
            save_file(package_state(model), str(staging / WEIGHTS), metadata={"format": "pt"})
        except SafetensorError as exc:  # its I/O errors (disk full) are not OSErrors
            raise StorageError(f"cannot write {output / WEIGHTS}: {exc}") from exc
        chmod_as_plain_write(staging / WEIGHTS)  # safetensors makes it 0600: servers run as another user
        shutil.copyfile(tokenizer, staging / TOKENIZER)
        meta = {"format_version": FORMAT_VERSION, "model": model.config.model_dump(),
                "tokenizer_sha256": hashlib.sha256(tokenizer.read_bytes()).hexdigest(), "step": step}
        (staging / CONFIG).write_text(json.dumps(meta, indent=1))
    return output


def fetch_package(uri: str, cache_dir: str | Path | None = None) -> Path:
    """A local directory holding the package at `uri` (a path, or s3://… downloaded to `cache_dir`)."""
    if scheme_of(uri) != "s3":
        return local_path_of(uri)
    if cache_dir is not None:  # one folder per URI: a new version never reuses an old file
        cache_dir = Path(cache_dir) / hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:16]
    store = S3Store(uri, cache_dir)
    for name in (WEIGHTS, CONFIG, TOKENIZER):
        if not store.exists(name):
            raise InputError(f"{uri}: not a model package ({name} missing)")
        local = store.local_path(name)
    return local.parent


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
