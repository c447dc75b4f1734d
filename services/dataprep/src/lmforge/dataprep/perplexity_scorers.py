"""The perplexity step's two scorers: a KenLM n-gram model (CCNet's) and an lmforge model package.

Both take a list of texts and return their perplexities; each imports its library (kenlm,
torch) when built, so that a pipeline without the step needs neither, and a missing library is
a one-line ConfigError naming the step and the extra to install."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from lmforge.common.errors import ConfigError, InputError
from lmforge.dataprep.ccnet_text import normalized_lines

EOT_TOKEN = "<|endoftext|>"  # noqa: S105 - data-prep's end-of-text token (config.tokenizer.eot_token)


def _import(module: str, step: str, extra: str):
    try:
        return __import__(module)
    except ImportError:
        raise ConfigError(f"steps.{step}: this backend needs the Python package {module!r} "
                          f"(pip install 'lmforge-dataprep[{extra}]')") from None


class KenLMScorer:
    """CCNet's document perplexity (cc_net/perplexity.py, as datatrove's KenLMModel): the
    log10 probability of each non-empty normalized line as a sentence, summed over the
    document, over its words plus one </s> per line: 10 ** (-Σ log10 p / Σ (words + 1))."""

    def __init__(self, model_path: str, step: str, normalize: bool = True):
        kenlm = _import("kenlm", step, "kenlm")
        if not os.path.isfile(model_path):
            raise ConfigError(f"steps.{step}.model_path: KenLM model not found: {model_path}")
        config = kenlm.Config()
        config.show_progress = False  # its progress bar and advice would go to every worker's stderr
        config.arpa_complain = kenlm.ARPALoadComplain.NONE
        try:
            self.model = kenlm.Model(model_path, config)
        except (OSError, RuntimeError) as exc:
            raise ConfigError(f"steps.{step}.model_path: cannot load KenLM model {model_path}: "
                              f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        self.normalize = normalize

    def perplexity(self, text: str) -> float:
        log_score, length = 0.0, 0
        for line in normalized_lines(text, self.normalize):
            log_score += self.model.score(line, bos=True, eos=True)
            length += len(line.split()) + 1
        return 10.0 ** (-log_score / length) if length else 10.0 ** -self.model.score("", bos=True, eos=True)

    def perplexities(self, texts: list[str]) -> list[float]:
        return [self.perplexity(text) for text in texts]


class LmforgeScorer:
    """Token perplexity under an lmforge model package (`lmforge-train export`'s directory):
    the package's tokenizer, the sequence <eot> + the document's tokens + <eot> cut to
    `max_tokens` + 1 tokens, and exp(mean negative log-likelihood) of every token after the
    first given the ones before (teacher forcing, as the canary scores). Documents are scored
    `batch_size` at a time, right-padded: causal attention keeps padding out of the real
    positions, and the padded positions are left out of the mean."""

    def __init__(self, model_path: str, step: str, *, batch_size: int, max_tokens: int, device: str,
                 threads: int):
        torch = _import("torch", step, "model")
        from tokenizers import Tokenizer

        from lmforge.model.package import TOKENIZER, fetch_package, load_package

        if "://" not in model_path and not os.path.isdir(model_path):
            raise ConfigError(f"steps.{step}.model_path: model package directory not found: {model_path}")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        elif device == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"steps.{step}.device: cuda, but torch sees no CUDA device")
        if threads:
            torch.set_num_threads(threads)
        try:
            path = fetch_package(model_path)
            self.model, _ = load_package(path, device=device)
        except InputError as exc:
            raise ConfigError(f"steps.{step}.model_path: {exc}") from None
        self.tokenizer = Tokenizer.from_file(str(Path(path) / TOKENIZER))
        self.eot = self._eot_id(Path(path) / TOKENIZER, step)
        self.torch, self.device, self.batch_size = torch, device, batch_size
        self.max_tokens = min(max_tokens, self.model.config.context_length - 1)

    def _eot_id(self, tokenizer_path: Path, step: str) -> int:
        """The end-of-text token that separates documents in training: tokenizer_config.json's
        `eos_token` beside the tokenizer (a Hugging Face package), else data-prep's <|endoftext|>."""
        eos = EOT_TOKEN
        config_path = tokenizer_path.with_name("tokenizer_config.json")
        if config_path.is_file():
            found = json.loads(config_path.read_text(encoding="utf-8")).get("eos_token")
            eos = found.get("content") if isinstance(found, dict) else found or EOT_TOKEN
        eot = self.tokenizer.token_to_id(eos)
        if eot is None:
            raise ConfigError(f"steps.{step}.model_path: the tokenizer has no end-of-text token {eos!r}")
        return eot

    def sequences(self, texts: list[str]) -> list[list[int]]:
        encoded = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return [([self.eot, *e.ids, self.eot])[: self.max_tokens + 1] for e in encoded]

    def perplexities(self, texts: list[str]) -> list[float]:
        out: list[float] = []
        sequences = self.sequences(texts)
        for start in range(0, len(sequences), self.batch_size):
            out += self._batch(sequences[start:start + self.batch_size])
        return out

    def _batch(self, sequences: list[list[int]]) -> list[float]:
        torch = self.torch
        width = max(map(len, sequences))
        ids = torch.zeros((len(sequences), width), dtype=torch.long)
        mask = torch.zeros((len(sequences), width - 1), dtype=torch.bool)
        for row, seq in enumerate(sequences):
            ids[row, : len(seq)] = torch.tensor(seq)
            mask[row, : len(seq) - 1] = True
        ids, mask = ids.to(self.device), mask.to(self.device)
        with torch.no_grad():
            logits, _ = self.model(ids[:, :-1])
            nll = torch.nn.functional.cross_entropy(
                logits.float().transpose(1, 2), ids[:, 1:], reduction="none")
        mean_nll = (nll * mask).sum(1) / mask.sum(1)
        return [math.exp(value) for value in mean_nll.tolist()]


# A process runs the steps of one input after another, each input with new step instances:
# the loaded model (a KenLM model can be gigabytes) is kept for the next input's step.
_loaded: dict[tuple, KenLMScorer | LmforgeScorer] = {}


def cached_scorer(step: str, backend: str, model_path: str, normalize: bool, batch_size: int, max_tokens: int,
                  device: str, threads: int) -> KenLMScorer | LmforgeScorer:
    try:
        stamp = os.stat(model_path).st_mtime_ns  # a model replaced at the same path is loaded again
    except OSError:
        stamp = None
    key = (backend, model_path, stamp, normalize, batch_size, max_tokens, device, threads)
    if key not in _loaded:
        if len(_loaded) >= 2:
            _loaded.clear()
        _loaded[key] = (KenLMScorer(model_path, step, normalize=normalize) if backend == "kenlm" else
                        LmforgeScorer(model_path, step, batch_size=batch_size, max_tokens=max_tokens,
                                      device=device, threads=threads))
    return _loaded[key]
