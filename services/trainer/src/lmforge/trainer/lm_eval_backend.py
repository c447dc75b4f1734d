"""lm-evaluation-harness's model interface over an lmforge model package, in process: `LmforgeLM`
scores loglikelihood and multiple_choice tasks with the package's own GPT and tokenizer.json,
no server and no transformers.

It splits context and continuation the way lm_eval's `hf` backend does, because it inherits that
code: `TemplateLM.loglikelihood` and `_encode_pair` (trailing spaces of the context move to the
continuation; the whole text is encoded and the context's tokens cut off its front). An empty
context is conditioned on the end-of-text token, as the `hf` backend does with the HF export's
tokenizer config (its BOS is the end-of-text token: hf_tokenizer). Texts are encoded as data
prep encoded the training data: no special tokens added. A sequence longer than the context
window keeps its last context_length + 1 tokens, as `hf` does. So the scores equal the `hf`
backend's on the package exported with `lmforge-train export --format hf` (tests: 1e-4).

Generation (`generate_until`) is out of scope: such a task is refused with a ConfigError.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from lm_eval import utils as lm_eval_utils
from lm_eval.api.model import TemplateLM
from tokenizers import Tokenizer

from lmforge.common.errors import ConfigError
from lmforge.model.hf_tokenizer import DEFAULT_EOS, token_id
from lmforge.model.package import TOKENIZER, load_package

Request = tuple[tuple[str, str] | None, list[int], list[int]]


class LmforgeLM(TemplateLM):
    """`model`: a GPT (lmforge.model.transformer); `tokenizer_json`: the package's tokenizer.json."""

    def __init__(self, model, tokenizer_json: str | Path, *, device: str = "cpu", batch_size: int = 16,
                 eot_token: str = DEFAULT_EOS):
        super().__init__()
        self.model = model.to(device).eval()
        self._device = torch.device(device)  # LM.device reads it
        self.batch_size = max(1, int(batch_size))
        self.codec = Tokenizer.from_file(str(tokenizer_json))
        self._eot_token_id = token_id(Path(tokenizer_json), eot_token)

    @classmethod
    def from_package(cls, path: str | Path, *, device: str = "cpu", batch_size: int = 16) -> LmforgeLM:
        """The model of the (verified) package directory `path`."""
        model, _meta = load_package(path, device)
        return cls(model, Path(path) / TOKENIZER, device=device, batch_size=batch_size)

    @property
    def eot_token_id(self) -> int:
        return self._eot_token_id

    @property
    def max_length(self) -> int:
        return self.model.config.context_length

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.codec.encode(string, add_special_tokens=False).ids

    def tok_decode(self, tokens: list[int], **kwargs) -> str:
        return self.codec.decode(tokens, skip_special_tokens=False)

    @torch.no_grad()
    def _loglikelihood_tokens(self, requests: list[Request], disable_tqdm: bool = False,
                              **kwargs) -> list[tuple[float, bool]]:
        """(sum of the continuation's logprobs, whether it is the greedy continuation) per request,
        in the requests' order; batched longest first, right-padded (causal: padding after a
        sequence changes none of its logits)."""
        order = sorted(range(len(requests)), key=lambda i: -len(requests[i][1]) - len(requests[i][2]))
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            windows, conts = [], []
            for i in chunk:
                _, context, continuation = requests[i]
                if not context or not continuation:
                    raise ValueError("a loglikelihood request needs a context and a continuation token")
                windows.append((context + continuation)[-(self.max_length + 1):][:-1])
                conts.append(continuation)
            width = max(len(w) for w in windows)
            batch = torch.zeros((len(windows), width), dtype=torch.long)
            for row, window in enumerate(windows):
                batch[row, :len(window)] = torch.tensor(window, dtype=torch.long)
            logits, _ = self.model(batch.to(self.device))
            logprobs = F.log_softmax(logits.float(), dim=-1)
            for row, (i, window, cont) in enumerate(zip(chunk, windows, conts, strict=True)):
                picked = logprobs[row, len(window) - len(cont):len(window)]
                target = torch.tensor(cont, dtype=torch.long, device=picked.device)
                greedy = bool((picked.argmax(dim=-1) == target).all())
                results[i] = (float(picked.gather(1, target[:, None]).sum()), greedy)
        return results  # type: ignore[return-value]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each whole text's loglikelihood over disjoint windows of the context length (the first
        conditioned on the end-of-text token), as the `hf` backend computes it."""
        totals = []
        for (string,) in (request.args for request in requests):
            windows = [(None, *lm_eval_utils.make_disjoint_window(window)) for window in
                       lm_eval_utils.get_rolling_token_windows(token_list=self.tok_encode(string),
                                                               prefix_token=self.prefix_token_id,
                                                               max_seq_len=self.max_length, context_len=1)]
            totals.append(sum(ll for ll, _ in self._loglikelihood_tokens(windows)))
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        raise ConfigError("lm-eval task needs generation (generate_until), which lmforge-train eval-checkpoint does "
                          "not do: give loglikelihood, loglikelihood_rolling or multiple_choice tasks")
