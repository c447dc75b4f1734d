"""`lmforge-train export`: a committed checkpoint → the serving package, in lmforge's format
(model_package, the default) or Hugging Face transformers' (`--format hf`, hf_package: loads in
transformers, lm-evaluation-harness and vLLM, and in lmforge-serve alike). The checkpoint is
read through checkpoint_reader: nothing in it is run as code."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import torch

from lmforge.common.checkpoint_layout import BAD_MARKER, COMMIT_MARKER
from lmforge.common.errors import ConfigError, InputError, StorageError
from lmforge.common.s3_store import S3Store
from lmforge.common.store import scheme_of
from lmforge.model import hf_config, hf_package
from lmforge.model import package as model_package
from lmforge.model.config import GPTConfig
from lmforge.model.hf_tokenizer import DEFAULT_EOS
from lmforge.model.rope import set_rope
from lmforge.model.transformer import GPT
from lmforge.trainer.checkpoint_reader import SafeFileSystemReader, load_state
from lmforge.trainer.config import TrainConfig

FORMATS = ("lmforge", "hf")


def export(checkpoint: str | Path, output: str | Path, *, package_format: str = "lmforge") -> Path:
    if package_format not in FORMATS:
        raise ConfigError(f"export format {package_format!r}: choose one of {', '.join(FORMATS)}")
    checkpoint, output = Path(checkpoint), Path(output)
    if not (checkpoint / COMMIT_MARKER).exists():
        raise InputError(f"{checkpoint}: not a committed checkpoint (no {COMMIT_MARKER})")
    if (checkpoint / BAD_MARKER).exists():
        raise InputError(f"{checkpoint}: marked bad by the trainer (it failed to load; see its {BAD_MARKER} file)")
    meta = json.loads((checkpoint / "meta.json").read_text())
    config = TrainConfig.model_validate(meta["config"])
    with tempfile.TemporaryDirectory(prefix="lmforge-export-") as scratch:
        tokenizer, tokenizer_info = tokenizer_files(config, meta["tokenizer_sha256"], Path(scratch))
        model_config = model_config_of(meta, config, tokenizer_info)
        if package_format == "hf":
            hf_config.hf_model_type(model_config)  # refuses an unmappable model before the weights are read
        model = consolidate(checkpoint, model_config)
        if package_format == "hf":
            eos = tokenizer_info.get("eot_token", DEFAULT_EOS)
            hf_package.write_hf_package(model, tokenizer, output, step=meta["step"], eos_token=eos)
        else:
            model_package.write_package(model, tokenizer, output, step=meta["step"])
    return output


def tokenizer_files(config: TrainConfig, tokenizer_sha256: str, scratch: Path) -> tuple[Path, dict]:
    """The run's tokenizer.json (the first data source's, checked against the sha256 the run trained
    with; an s3:// source's is downloaded into `scratch`) and the manifest's `tokenizer` entry."""
    tokenizer, manifest = _source_files(config.data.sources[0].path, scratch)
    if not tokenizer.is_file() or hashlib.sha256(tokenizer.read_bytes()).hexdigest() != tokenizer_sha256:
        raise InputError(f"{tokenizer}: missing, or not the tokenizer this checkpoint was trained with")
    return tokenizer, json.loads(manifest.read_text())["tokenizer"]


def model_config_of(meta: dict, config: TrainConfig, tokenizer_info: dict) -> GPTConfig:
    """The shape the run trained (meta's model_config: a model.init_from run's is not its preset's, a
    schedule stage's RoPE is the stage's); older checkpoints: the config's model."""
    if "model_config" in meta:
        return GPTConfig.model_validate(meta["model_config"])
    return config.model.build(vocab_size=tokenizer_info["vocab_size"])


def consolidate(checkpoint: Path, model_config: GPTConfig) -> GPT:
    """The model of a DCP state directory (its "model" entry: a full checkpoint or the trainer's
    model-only weights save), its shards of any world size and layout read by this process alone
    (no collective, so the trainer's rank 0 runs it beside training). The GPT is built on the meta
    device and filled from the checkpoint: no random initial weights are drawn, so the process's
    RNG (the trainer's, when run in its thread) is left alone."""
    with torch.device("meta"):
        model = GPT(model_config)
    model.to_empty(device="cpu")
    if model_config.tie_embeddings:
        model.lm_head.weight = model.wte.weight  # to_empty gave the head a tensor of its own
    set_rope(model, model_config, None, None)  # the non-persistent tables, which no checkpoint holds
    state = {"model": model.state_dict()}
    load_state(state, SafeFileSystemReader(checkpoint), no_dist=True)
    model.load_state_dict(state["model"])
    return model


def _source_files(uri: str, scratch: Path) -> tuple[Path, Path]:
    """tokenizer.json and manifest.json of the first data source, as local files: a local
    directory's own, or (an s3:// source, as on a cluster) downloaded into `scratch`."""
    if scheme_of(uri) != "s3":
        return Path(uri) / "tokenizer.json", Path(uri) / "manifest.json"
    store = S3Store(uri, scratch)
    try:
        return store.local_path("tokenizer.json"), store.local_path("manifest.json")
    except StorageError as exc:
        raise InputError(f"{uri}: cannot read the data source's tokenizer.json / manifest.json ({exc})") from exc
