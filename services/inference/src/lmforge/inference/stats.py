"""What the engine counts, read by /metrics at scrape time (vLLM's names in brackets)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStats:
    """Cumulative since the engine started (a model swap starts a new engine: counters reset,
    which Prometheus' rate() handles), plus the KV-cache pool's current state."""

    preemptions: int = 0  # running sequences evicted for lack of KV blocks, recomputed later [num_preemptions]
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache at admission [prefix_cache_queries]
    prefix_cache_hits: int = 0  # of which found cached: not prefilled again [prefix_cache_hits]
    prefill_tokens: int = 0  # tokens computed by prefill (chunks included), cache hits excluded
    kv_blocks_total: int = 0  # blocks in the pool
    kv_blocks_in_use: int = 0  # blocks held by running sequences (cached blocks of finished ones are free)
    block_size: int = 16  # tokens per block

    @property
    def kv_cache_usage(self) -> float:
        """Blocks in use over blocks in the pool [kv_cache_usage_perc]."""
        return self.kv_blocks_in_use / self.kv_blocks_total if self.kv_blocks_total else 0.0
