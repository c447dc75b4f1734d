"""`model.init_from`: continued pretraining from a model package, lmforge's own or a Hugging
Face transformers directory of a supported architecture (Llama, Qwen3, Mixtral, Qwen3-MoE,
GPT-NeoX, GPT-2; lmforge.model.hf_package). The package gives the architecture (the preset is
not used) and the initial weights; `model.overrides` may change what leaves the weights' shapes
alone (dropout, the MoE training options, the context length of a rotary model)."""

from __future__ import annotations

from pathlib import Path

from lmforge.common.errors import ConfigError
from lmforge.common.store import scheme_of
from lmforge.model.config import GPTConfig
from lmforge.model.package import load_package
from lmforge.model.transformer import GPT
from lmforge.trainer.config import ModelSection


def initial_weights(section: ModelSection, vocab_size: int, tokenizer_sha256: str) -> tuple[GPTConfig, dict]:
    """The model config and state_dict to start from: the package's, with model.overrides on
    top. The package must have been trained with (or, for a third-party model, ship) the
    tokenizer the training data was tokenized with."""
    if scheme_of(section.init_from) == "s3":
        raise ConfigError("model.init_from: give a local directory (download the package first; s3:// is not read)")
    path = Path(section.init_from)
    model, meta = load_package(path)
    if meta["tokenizer_sha256"] != tokenizer_sha256:
        raise ConfigError(
            f"model.init_from: {path}/tokenizer.json is not the tokenizer the training data was "
            f"tokenized with (tokenize the data with it: dataprep tokenizer.path)"
        )
    try:
        config = GPTConfig.model_validate({**model.config.model_dump(), **section.overrides})
    except ValueError as exc:
        raise ConfigError(f"model.overrides on top of {path}: {exc}") from exc
    if config.vocab_size < vocab_size:
        raise ConfigError(
            f"model.init_from: {path} has {config.vocab_size} token embeddings, the training data's "
            f"tokenizer {vocab_size} tokens"
        )
    return config, model.state_dict()


def load_initial_state(model: GPT, state: dict) -> None:
    """Copy the initial weights into the freshly built model (before it is parallelized). An
    MoE selection bias the package lacks (balancing: bias set by the overrides) starts at zero."""
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a size mismatch; its message spans lines
        reason = " ".join(str(exc).split())
        raise ConfigError(f"model.overrides change the shape of model.init_from's weights: {reason}") from exc
    missing = [name for name in missing if not name.endswith("router.selection_bias")]
    if missing or unexpected:
        raise ConfigError(
            f"model.overrides change model.init_from's weights (missing {missing}, unexpected {unexpected})"
        )
