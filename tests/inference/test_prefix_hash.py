"""Prefix-cache keys: a block is keyed by a SHA-256 chained over its exact token ids and salted
with the model's identity, so prompts that differ never share KV blocks, even where Python's
hash() (the keys before) collides, and a model's keys are not another's."""

from __future__ import annotations

import builtins
import hashlib
import struct

import torch

from lmforge.inference.block_manager import BlockManager
from lmforge.inference.engine import Engine
from lmforge.inference.sampling import SamplingParams
from lmforge.inference.scheduler import Scheduler
from lmforge.inference.sequence import Sequence
from lmforge.model.config import GPTConfig
from lmforge.model.transformer import GPT

BLOCK = 4
COLLIDES_WITH_0 = 2**61 - 1  # hash(2**61 - 1) == hash(0): ints hash modulo the Mersenne prime 2**61 - 1


def prefill(scheduler: Scheduler, prompt: list[int]) -> Sequence:
    """Admit `prompt` alone, compute its prefill (its full blocks join the prefix cache) and finish it."""
    seq = Sequence(0, prompt, SamplingParams(), None)
    scheduler.waiting.append(seq)
    [(scheduled, count)] = scheduler.schedule()
    assert scheduled is seq
    scheduler.computed(seq, count)
    scheduler.finish(seq)
    return seq


def test_prompts_whose_builtin_hashes_collide_never_share_blocks():
    first = [0, 0, 0, 0, 7, 8, 9, 10, 11]
    crafted = [COLLIDES_WITH_0, 0, 0, 0, 7, 8, 9, 10, 11]
    # Under the old keys, hash((previous, block tokens)), the crafted prompt's blocks are the first's.
    assert hash((None, tuple(first[:BLOCK]))) == hash((None, tuple(crafted[:BLOCK])))
    scheduler = Scheduler(BlockManager(16, BLOCK), max_running=4, max_batched_tokens=64)
    prefill(scheduler, first)
    prefill(scheduler, crafted)
    assert scheduler.stats.prefix_cache_hits == 0
    prefill(scheduler, list(first))  # the same tokens again: its two full blocks are cached
    assert scheduler.stats.prefix_cache_hits == 2 * BLOCK


def test_different_blocks_are_never_shared_even_if_every_builtin_hash_collides(monkeypatch):
    scheduler = Scheduler(BlockManager(16, BLOCK), max_running=4, max_batched_tokens=64)
    monkeypatch.setattr(builtins, "hash", lambda value: 0)
    first = prefill(scheduler, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    second = prefill(scheduler, [9, 8, 7, 6, 5, 4, 3, 2, 1])
    monkeypatch.undo()
    assert scheduler.stats.prefix_cache_hits == 0
    assert len(set(first.block_hashes + second.block_hashes)) == 4


def test_a_key_is_the_sha256_of_its_parents_key_and_its_token_ids():
    blocks = BlockManager(8, BLOCK, salt=b"model-a")
    tokens = [5, 0, 2**40, 3, 1, 1, 1, 1, 9, 9]  # two full blocks and two tokens
    keys: list[bytes] = []
    blocks.chain_hashes(keys, tokens)
    root = hashlib.sha256(b"lmforge-prefix-cache-v1\0model-a").digest()
    first = hashlib.sha256(root + struct.pack("=4q", *tokens[:4])).digest()
    assert keys == [first, hashlib.sha256(first + struct.pack("=4q", *tokens[4:8])).digest()]
    extended: list[bytes] = []  # block by block, as a sequence's keys grow with its tokens
    blocks.chain_hashes(extended, tokens[:4])
    blocks.chain_hashes(extended, tokens[4:])
    assert extended == keys


def test_keys_differ_across_model_identities():
    tokens = list(range(12))
    keys = {}
    for salt in (b"model-a", b"model-b", b"model-a"):
        chain: list[bytes] = []
        BlockManager(8, BLOCK, salt=salt).chain_hashes(chain, tokens)
        assert keys.setdefault(salt, chain) == chain  # deterministic for one identity
    assert not set(keys[b"model-a"]) & set(keys[b"model-b"])

    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", n_layer=1, n_embd=32, n_head=2, vocab_size=53, context_length=32))
    engines = [Engine(model, block_size=BLOCK, model_identity=identity) for identity in ("pkg-v1", "pkg-v2")]
    seqs = [engine.add(tokens, SamplingParams(max_tokens=1, temperature=0)) for engine in engines]
    for engine in engines:
        engine.step()
    assert all(len(seq.block_hashes) == 3 for seq in seqs)
    assert not set(seqs[0].block_hashes) & set(seqs[1].block_hashes)
