"""A request inside the engine: its tokens, sampling state, KV blocks and timestamps."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from lmforge.inference.sampling import SamplingParams


def check_prompt(prompt: list[int], context_length: int) -> None:
    """A prompt the engine can take: not empty, and shorter than the context."""
    if not prompt:
        raise ValueError("the prompt is empty")
    if len(prompt) >= context_length:
        raise ValueError(f"the prompt has {len(prompt)} tokens; the context holds {context_length}")


@dataclass(eq=False)
class Sequence:
    id: int
    prompt: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    output: list[int] = field(default_factory=list)
    request_id: str | None = None  # the API's id of the request (its log lines)
    finish_reason: str | None = None  # "length", "stop", "cancelled", "error"
    error: Exception | None = None  # why the engine failed it (finish_reason "error")
    logprobs: list[float] = field(default_factory=list)  # of each output token, when asked for
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    # The paged KV cache: the blocks holding this sequence's tokens, and how many of its tokens
    # (prompt, then output) have their keys and values there. A preempted sequence loses both
    # and is prefilled again (prompt and output so far) when readmitted.
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0
    block_hashes: list[bytes] = field(default_factory=list)  # its full blocks' keys, from the first (prefix caching)
    arrived: float = field(default_factory=time.monotonic)  # time.monotonic() throughout
    scheduled_at: float | None = None  # first admitted into the running batch: prefill starts
    first_token_at: float | None = None  # prefill done
    finished_at: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    def tokens(self, start: int, stop: int) -> list[int]:
        """Tokens start..stop-1 of prompt + output."""
        split = len(self.prompt)
        if stop <= split:
            return self.prompt[start:stop]
        if start >= split:
            return self.output[start - split:stop - split]
        return self.prompt[start:] + self.output[:stop - split]
