"""The serving package `lmforge-train export` writes and inference loads (docs/design.md):

    model.safetensors   consolidated weights (the tied output head is not stored twice)
    config.json         {"model": GPTConfig fields, "tokenizer_sha256", "step", "format_version",
                         "files": {name: {"sha256", "bytes"}} of the other two files}
    tokenizer.json

Weights are read with safetensors only: nothing is unpickled. `verify_package` checks a
package without loading it; `load_package` verifies and loads. Packages written before the
`files` checksums load as before; `require_checksums` (what a model pointer's packages get)
refuses them. A Hugging Face format directory (`export --format hf`, lmforge.model.hf_package)
verifies and loads through the same two functions.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from lmforge.common.atomic_files import atomic_dir, chmod_as_plain_write
from lmforge.common.errors import InputError, StorageError
from lmforge.common.s3_store import S3Store
from lmforge.common.storage import sha256_file
from lmforge.common.store import local_path_of, scheme_of
from lmforge.model import hf_package
from lmforge.model.config import GPTConfig
from lmforge.model.transformer import GPT

FORMAT_VERSION = 1
WEIGHTS, CONFIG, TOKENIZER = "model.safetensors", "config.json", "tokenizer.json"
TIED = "lm_head.weight"


def package_state(model: GPT) -> dict:
    """The weights to store: all but a tied output head (it is the token embedding)."""
    tied = model.config.tie_embeddings
    return {name: tensor.detach().contiguous().cpu() for name, tensor in model.state_dict().items()
            if not (tied and name == TIED)}


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
                "tokenizer_sha256": hashlib.sha256(tokenizer.read_bytes()).hexdigest(), "step": step,
                "files": file_checksums(staging)}
        (staging / CONFIG).write_text(json.dumps(meta, indent=1))
    return output


def file_checksums(path: Path) -> dict[str, dict]:
    """config.json's `files`: the sha256 and size of the weights and the tokenizer in `path`."""
    return {name: {"sha256": sha256_file(path / name), "bytes": (path / name).stat().st_size}
            for name in (WEIGHTS, TOKENIZER)}


def download_dir(uri: str, cache_dir: str | Path) -> Path:
    """Where fetch_package downloads the s3:// package `uri`: one folder per URI, so a new
    version never reuses an old file."""
    return Path(cache_dir) / hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:16]


def fetch_package(uri: str, cache_dir: str | Path | None = None) -> Path:
    """A local directory holding the package at `uri` (a path, or s3://… downloaded to `cache_dir`)."""
    if scheme_of(uri) != "s3":
        return local_path_of(uri)
    if cache_dir is not None:
        cache_dir = download_dir(uri, cache_dir)
    store = S3Store(uri, cache_dir)
    for name in (WEIGHTS, CONFIG, TOKENIZER):
        if not store.exists(name):
            raise InputError(f"{uri}: not a model package ({name} missing)")
        local = store.local_path(name)
    return local.parent


def _hf_config(path: Path) -> dict | None:
    """config.json when it is a transformers config (a Hugging Face format package), else None."""
    try:
        meta = json.loads((path / CONFIG).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # the lmforge format's checks below name what is wrong
    return meta if hf_package.is_hf_config(meta) else None


def read_package_config(path: Path, shown_as: str | None = None):
    """A package's config.json, parsed (either format); InputError when it is missing or not JSON.
    `shown_as` names the package in the error (default: the directory)."""
    name = shown_as or str(path)
    if not (path / CONFIG).is_file():
        raise InputError(f"{name}: not a model package ({CONFIG} missing)")
    try:
        return json.loads((path / CONFIG).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{name}/{CONFIG}: not valid JSON ({exc})") from exc


def verify_package(path: str | Path, *, require_checksums: bool = False) -> dict:
    """The package's config.json, once the files are there, the format is known, the tokenizer
    is the one the model was trained with and each file matches its `files` checksum (required
    with `require_checksums`). Raises InputError naming what is wrong. A Hugging Face format
    package gives its description in the same terms (hf_package.verify_hf_package)."""
    path = Path(path)
    hf_meta = _hf_config(path)
    if hf_meta is not None:
        return hf_package.verify_hf_package(path, hf_meta, require_checksums=require_checksums)
    for name in (WEIGHTS, CONFIG, TOKENIZER):
        if not (path / name).is_file():
            raise InputError(f"{path}: not a model package ({name} missing)")
    meta = read_package_config(path)
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        version = meta.get("format_version") if isinstance(meta, dict) else None
        raise InputError(f"{path}: unsupported package format {version!r}")
    if hashlib.sha256((path / TOKENIZER).read_bytes()).hexdigest() != meta.get("tokenizer_sha256"):
        raise InputError(f"{path}: tokenizer.json does not match the hash the model was trained with")
    files = meta.get("files")
    if files is None:
        if require_checksums:
            raise InputError(f"{path}: config.json has no file checksums (a package exported before they were "
                             f"recorded): export it again")
        return meta
    for name in (WEIGHTS, TOKENIZER):
        expected = files.get(name) if isinstance(files, dict) else None
        if not isinstance(expected, dict) or not {"sha256", "bytes"} <= set(expected):
            raise InputError(f"{path / CONFIG}: no checksum of {name} in `files`")
        if (path / name).stat().st_size != expected["bytes"]:
            raise InputError(f"{path / name}: {(path / name).stat().st_size} bytes, config.json records "
                             f"{expected['bytes']}")
        if sha256_file(path / name) != expected["sha256"]:
            raise InputError(f"{path / name}: sha256 does not match config.json (corrupt or replaced)")
    return meta


def load_package(path: str | Path, device: str = "cpu", *, require_checksums: bool = False) -> tuple[GPT, dict]:
    """The model (eval mode) and the package's config.json, once `verify_package` passes."""
    from safetensors.torch import load_file

    path = Path(path)
    meta = verify_package(path, require_checksums=require_checksums)
    if meta.get("format") == "hf":
        config, state = hf_package.read_hf_state(path, meta["hf_config"])
        meta = {**meta, "model": config.model_dump()}
    else:
        config, state = GPTConfig.model_validate(meta["model"]), load_file(str(path / WEIGHTS), device="cpu")
    model = GPT(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - ({TIED} if model.config.tie_embeddings else set()):
        raise InputError(f"{path}: weights do not fit the config (missing {missing}, unexpected {unexpected})")
    return model.to(device).eval(), meta
