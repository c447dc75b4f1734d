"""Fixtures shared by the trainer tests: the one-process reference runs that the parallel layouts'
losses are compared with, each trained once per session.

test_parallel, test_tensor_parallel and test_context_parallel_training compare against the same
two runs (20 steps of the GPT-2 shape and of llama-debug, batch 8 over the same data). Each test
trains under a run directory name of its own inside the reference's folder, so sharing them
changes no run that a test reads."""

from __future__ import annotations

import pytest

from tests.trainer.test_parallel import Reference, single_rank_reference


@pytest.fixture(scope="session")
def gpt_reference(tmp_path_factory) -> Reference:
    """GPT-2's shape, small: learned positions, a tied head."""
    return single_rank_reference(tmp_path_factory, "gpt")


@pytest.fixture(scope="session")
def llama_reference(tmp_path_factory) -> Reference:
    """The Llama-style debug preset: GQA, SwiGLU, RMSNorm, RoPE θ 500,000 with Llama 3's scaling."""
    return single_rank_reference(tmp_path_factory, "llama-debug")
