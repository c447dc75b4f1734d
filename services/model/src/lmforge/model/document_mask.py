"""Document masking: in a packed training sequence a token attends only to earlier tokens of its own document.

Data-prep packs documents back to back, each ending with the end-of-text token (`eot_id` in the shard
manifest's tokenizer section). `document_ids` numbers the documents of a sequence; `document_attention`
attends under causal AND same-document. Positions stay the sequence's (not reset per document): RoPE is
relative, so with RoPE a masked packed sequence gives each document's logits as if it ran alone (with
learned positions it does not, the embeddings of later documents being those of later positions).

Two paths with one meaning. On CUDA, flex attention (torch.nn.attention.flex_attention), compiled once
per process, with a document-causal BlockMask: blocks of keys that no query of a block may see (earlier
documents, future tokens) are skipped, so a sequence of many short documents costs about the sum of
their own causal attentions, not the whole sequence's. Elsewhere (CPU), and with attention dropout (flex
has none), SDPA with a dense boolean mask. torch 2.13's flex runs on CPU forward only (it refuses
a backward there), so `backend="flex"` on CPU serves to check the two paths agree.

A model calls the attention once per layer with the same documents: the BlockMask is built once and
reused while the same tensors come (a one-entry cache keyed by the tensors' identity and version).
Compiles are static-shaped (dynamic=False): torch 2.13's CPU code for a dynamic-shape flex recompile does
not build, and training's shapes are fixed. Inside a compiled model, the model's compilation takes in
flex attention and the BlockMask's construction instead.
"""

from __future__ import annotations

import functools
from typing import Literal

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

__all__ = ["Backend", "document_attention", "document_ids", "query_documents"]

Backend = Literal["auto", "sdpa", "flex"]


def document_ids(tokens: torch.Tensor, eot_id: int) -> torch.Tensor:
    """The document index (B, T) int32 of each position of token ids (B, T): the count of end-of-text
    tokens strictly before it (an end-of-text token belongs to the document it ends)."""
    eot = (tokens == eot_id).to(torch.int32)
    return eot.cumsum(dim=1, dtype=torch.int32) - eot


class _LastOf:
    """A one-entry cache keyed by the identity and version of tensors (or None): the model's layers
    pass the same ones, so what is derived from them is computed once per forward. Holding them keeps
    their ids from being reused by other tensors."""

    def __init__(self):
        self.key: tuple = ()
        self.versions: tuple = ()
        self.value = None

    @staticmethod
    def _versions(tensors: tuple) -> tuple:
        return tuple(None if t is None else t._version for t in tensors)

    def get(self, tensors: tuple):
        if (len(tensors) == len(self.key) and all(a is b for a, b in zip(tensors, self.key, strict=True))
                and self._versions(tensors) == self.versions):
            return self.value
        return None

    def put(self, tensors: tuple, value):
        if not torch.compiler.is_compiling():
            self.key, self.versions, self.value = tensors, self._versions(tensors), value
        return value


_QUERY_DOCUMENTS = _LastOf()
_BLOCK_MASKS = _LastOf()


def query_documents(documents: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
    """The documents (B, Tq) of queries at `positions` (B, Tq) of a sequence whose documents are
    `documents` (B, T); `documents` itself when positions is None (the queries are 0..T-1)."""
    if positions is None:
        return documents
    key = (documents, positions)
    cached = _QUERY_DOCUMENTS.get(key)
    return cached if cached is not None else _QUERY_DOCUMENTS.put(key, documents.gather(1, positions.long()))


@functools.cache
def _compiled_flex_attention():
    return torch.compile(flex_attention, dynamic=False)


@functools.cache
def _compiled_create_block_mask():
    # Uncompiled, create_block_mask materializes the whole (B, Tq, Tk) mask: 1 GiB a sequence at 32k tokens.
    return torch.compile(create_block_mask, dynamic=False)


def _flex_attention():
    # Inside a compiled model the model's compilation takes in flex attention itself.
    return flex_attention if torch.compiler.is_compiling() else _compiled_flex_attention()


def _block_mask(q_positions: torch.Tensor | None, q_documents: torch.Tensor, k_documents: torch.Tensor) -> BlockMask:
    key = (q_positions, q_documents, k_documents)
    cached = _BLOCK_MASKS.get(key)
    if cached is not None:
        return cached

    def document_causal(b, h, q_idx, kv_idx):
        q_pos = q_idx if q_positions is None else q_positions[b, q_idx]
        return (q_pos >= kv_idx) & (q_documents[b, q_idx] == k_documents[b, kv_idx])

    (batch, tq), tk, device = q_documents.shape, k_documents.shape[1], q_documents.device
    compiled = device.type == "cuda" and not torch.compiler.is_compiling()
    create = _compiled_create_block_mask() if compiled else create_block_mask
    return _BLOCK_MASKS.put(key, create(document_causal, batch, None, tq, tk, device=device))


def _dense_mask(q_positions: torch.Tensor | None, q_documents: torch.Tensor, k_documents: torch.Tensor) -> torch.Tensor:
    """(B, 1, Tq, Tk) True where a query may attend to a key."""
    tq, tk = q_documents.shape[1], k_documents.shape[1]
    key_positions = torch.arange(tk, device=q_documents.device)
    if q_positions is None:
        q_positions = torch.arange(tq, device=q_documents.device).expand(q_documents.shape[0], -1)
    causal = q_positions[:, :, None] >= key_positions
    return (causal & (q_documents[:, :, None] == k_documents[:, None, :]))[:, None]


def document_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor | None,
                       q_documents: torch.Tensor, k_documents: torch.Tensor, dropout_p: float = 0.0,
                       backend: Backend = "auto") -> torch.Tensor:
    """Queries q (B, H, Tq, D) at sequence positions `q_positions` (B, Tq) (None: 0..Tq-1) attend to
    keys and values (B, kv_heads, Tk, D) at positions 0..Tk-1 (grouped-query when the head counts
    differ) where the key is not later and of the same document: q_documents (B, Tq), k_documents (B, Tk).
    Returns (B, H, Tq, D). `backend`: "auto" (flex on CUDA without dropout, else SDPA), "sdpa" or "flex"."""
    if backend == "auto":
        backend = "flex" if q.device.type == "cuda" and dropout_p == 0.0 else "sdpa"
    gqa = q.shape[1] != k.shape[1]
    if backend == "flex":
        if dropout_p:
            raise ValueError("flex attention has no dropout: use the sdpa backend")
        block_mask = _block_mask(q_positions, q_documents, k_documents)
        return _flex_attention()(q, k, v, block_mask=block_mask, enable_gqa=gqa)
    if backend != "sdpa":
        raise ValueError(f"unknown document attention backend {backend!r} (auto, sdpa or flex)")
    mask = _dense_mask(q_positions, q_documents, k_documents)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=gqa)
