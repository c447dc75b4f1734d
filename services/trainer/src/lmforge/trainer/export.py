"""`lmforge-train export`: a committed checkpoint → the serving package, in lmforge's format
(model_package, the default) or Hugging Face transformers' (`--format hf`, hf_package: loads in
transformers, lm-evaluation-harness and vLLM, and in lmforge-serve alike). The checkpoint is
read through checkpoint_reader: nothing in it is run as code."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

from lmforge.common.checkpoint_layout import BAD_MARKER, COMMIT_MARKER
from lmforge.common.errors import ConfigError, InputError, StorageError
from lmforge.common.s3_store import S3Store
from lmforge.common.store import scheme_of
from lmforge.model import hf_config, hf_package
from lmforge.model import package as model_package
from lmforge.model.config import GPTConfig
from lmforge.model.hf_tokenizer import DEFAULT_EOS
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
        tokenizer, manifest = _source_files(config.data.sources[0].path, Path(scratch))
        if not tokenizer.is_file() or hashlib.sha256(tokenizer.read_bytes()).hexdigest() != meta["tokenizer_sha256"]:
            raise InputError(f"{tokenizer}: missing, or not the tokenizer this checkpoint was trained with")
        tokenizer_info = json.loads(manifest.read_text())["tokenizer"]
        if "model_config" in meta:  # the shape the run trained (a model.init_from run's is not its preset's)
            model_config = GPTConfig.model_validate(meta["model_config"])
        else:
            model_config = config.model.build(vocab_size=tokenizer_info["vocab_size"])
        if package_format == "hf":
            hf_config.hf_model_type(model_config)  # refuses an unmappable model before the weights are read
        model = GPT(model_config)
        state = {"model": model.state_dict()}
        load_state(state, SafeFileSystemReader(checkpoint))  # consolidates the shards of any world size
        model.load_state_dict(state["model"])
        if package_format == "hf":
            eos = tokenizer_info.get("eot_token", DEFAULT_EOS)
            hf_package.write_hf_package(model, tokenizer, output, step=meta["step"], eos_token=eos)
        else:
            model_package.write_package(model, tokenizer, output, step=meta["step"])
    return output


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
