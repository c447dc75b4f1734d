"""`lmforge-serve` configuration: defaults < YAML (--config) < env LMFORGE_SERVE__… < CLI flags."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from lmforge.common.config import StrictModel, load_config


class EngineConfig(StrictModel):
    """The engine: continuous batching over a paged KV cache with chunked prefill and prefix caching
    (vLLM's design; its defaults where they carry over)."""

    max_running: int = Field(64, ge=1, description="most sequences in the running batch (vLLM's max_num_seqs); "
                                                   "KV blocks are the usual limit")
    max_waiting: int = Field(64, ge=0, description="queued requests beyond which the API answers 429")
    max_batched_tokens: int = Field(512, ge=1, description="tokens computed per engine step (vLLM's "
                                    "max_num_batched_tokens): decodes first, then prompt chunks; a longer prompt "
                                    "is prefilled over several steps while the others keep decoding")
    block_size: int = Field(16, ge=1, description="tokens per KV-cache block (vLLM's default)")
    kv_cache_bytes: int | None = Field(None, ge=1, description="the KV-cache pool's size; unset: "
                                       "kv_cache_memory_fraction of the GPU's free memory after loading the "
                                       "model, or 8 full contexts on CPU. It must hold one full context")
    kv_cache_memory_fraction: float = Field(0.5, gt=0, le=0.95, description="with kv_cache_bytes unset, on a "
                                            "GPU: the share of free memory taken by the KV-cache pool")
    prefix_caching: bool = Field(True, description="keep computed full KV blocks keyed by their token prefix and "
                                 "reuse them for prompts that start the same (system prompts, few-shot examples)")
    step_delay_seconds: float = Field(0.0, ge=0, description="artificial delay per engine step (alert drills)")
    attention: Literal["auto", "gather", "flex", "flashinfer"] = Field(
        "auto", description="how attention reads the paged KV cache: `gather` copies each sequence's keys and "
        "values into a dense tensor per layer (the reference); `flex`, torch's compiled flex_attention over the cache "
        "in place; `flashinfer`, FlashInfer's paged kernels (CUDA, fp16/bf16; else flex). `auto`: gather on CPU (the "
        "faster there), flashinfer on CUDA when it imports, else flex")
    cuda_graphs: bool = Field(True, description="on CUDA: capture decode-only steps as CUDA graphs at start (batch "
                              "sizes 2, 4, 8, ... up to max_running; a batch is padded up to the next) and replay them")


class TraceConfig(StrictModel):
    """POST /v1/trace and `trace: true` on completions: the spans of a text found verbatim in the training data,
    with the documents they come from (an exact-match index data prep builds, lmforge.trace)."""

    index: str | None = Field(None, description="the trace index: a directory, or s3://BUCKET/PREFIX/.../trace-index "
                              "(a data-prep output's trace-index/), downloaded to cache_dir; unset: no /v1/trace "
                              "(404 trace_not_enabled)")
    cache_dir: str = Field("/tmp/lmforge-trace",  # noqa: S108
                           description="where an s3:// index is downloaded (each file verified against index.json; "
                                       "other index versions there are deleted)")
    max_tokens: int = Field(2048, ge=1, description="the most tokens a traced text may have (more: 413)")
    max_documents: int = Field(50, ge=1, description="the most source documents a request may ask for per span")
    min_span_tokens: int = Field(8, ge=4, description="a request's default shortest span reported, in tokens")
    max_count: int = Field(1000, ge=1, description="the search's work bound: a span found more often than this in the "
                           "training data (boilerplate) is not reported")
    snippet_tokens: int = Field(40, ge=0, description="tokens of context each source document's snippet shows "
                                "around the span")
    max_concurrent: int = Field(2, ge=1, description="traces computed at once; a request beyond that gets 429")
    timeout_s: float = Field(5.0, gt=0, description="a trace taking longer is answered 504 (the search finishes "
                             "in the background, holding its slot)")


class ServeConfig(StrictModel):
    model: str = Field("", description="model package (a directory or s3://BUCKET/PREFIX/models/VERSION) or a model "
                                       "pointer naming one (a JSON file or object, e.g. s3://BUCKET/PREFIX/models/"
                                       "current), which the server follows while it serves")
    model_name: str | None = Field(None, description="name served in /v1/models (default: the last path segment of "
                                                     "`model`: the package folder, or the pointer's name)")
    pointer_poll_seconds: float = Field(30.0, gt=0, description="with a model pointer: how often it is re-read; a "
                                                                "new package is verified and loaded, then swapped in")
    swap_drain_seconds: float = Field(600.0, gt=0, description="after a swap, how long requests started on the "
                                                               "old model may take to finish before it is stopped")
    host: str = "0.0.0.0"  # noqa: S104 - a container's server
    port: int = Field(8000, ge=0, le=65535)
    metrics_port: int | None = Field(None, ge=0, le=65535,
                                     description="serve /metrics on this port instead of the API port")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    cache_dir: str = Field("/tmp/lmforge-models",  # noqa: S108
                           description="where s3:// packages are downloaded; one server's own (a swap "
                                       "deletes the download of the model it retires)")
    api_keys_file: str | None = Field(None, description="one key per line (a mounted Secret); unset: no auth")
    api_docs: bool = Field(True, description="serve /docs, /redoc and /openapi.json (without authentication: "
                                             "they describe the API, they do not call it)")
    max_tokens_limit: int = Field(1024, ge=1, description="the largest max_tokens a request may ask for")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="larger request bodies get 413")
    retry_after_seconds: int = Field(1, ge=1, description="Retry-After sent with 429")
    engine_layout: Literal["process", "thread"] = Field(
        "process", description="where the engine (scheduler, KV cache, model, sampling) runs: `process`, a process "
        "of its own beside the API's, so that HTTP, JSON and tokenization never hold up a step; `thread`, a thread "
        "of the API process (one process to debug)")
    engine: EngineConfig = EngineConfig()
    trace: TraceConfig = TraceConfig()


def load_serve_config(path: str | None = None, overrides: list[str] = ()) -> ServeConfig:
    return load_config(ServeConfig, path, overrides, env_prefix="LMFORGE_SERVE")
