"""One loaded model package and the engine thread serving it (`ServedModel`), how it is loaded
(`load_model`), and the leases requests hold on it: a model swapped out (model_swap) is stopped
only once the last request that started on it has returned its lease. What both the service and
the pointer follower use, so that neither imports the other for it."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lmforge.common.logging import get_logger
from lmforge.inference.config import ServeConfig
from lmforge.inference.engine import Engine
from lmforge.inference.engine_thread import EngineThread
from lmforge.inference.text import Codec
from lmforge.model.package import TOKENIZER, fetch_package, load_package

log = get_logger("inference")


def default_model_name(uri: str) -> str:
    return Path(uri.rstrip("/")).name or "model"


class Lease:
    """A request's hold on the model it started with; released once (also by a second call)."""

    def __init__(self, model: ServedModel):
        self.model, self._held = model, True
        model._count_lease(+1)

    def release(self) -> None:
        if self._held:
            self._held = False
            self.model._count_lease(-1)

    def __enter__(self) -> ServedModel:
        return self.model

    def __exit__(self, *exc) -> None:
        self.release()


@dataclass(eq=False)
class ServedModel:
    """One loaded package and the engine thread serving it."""

    package: str  # the package URI it was loaded from
    path: Path  # its local copy (a download for s3://)
    step: int | None
    codec: Codec
    engine_thread: EngineThread
    context_length: int
    loaded_at: float = field(default_factory=time.time)
    _leases: int = 0
    _idle: threading.Condition = field(default_factory=threading.Condition)

    @property
    def version(self) -> str:
        """The package's folder name (model_info's `version` label)."""
        return default_model_name(self.package)

    @property
    def leases(self) -> int:
        return self._leases

    def lease(self) -> Lease:
        return Lease(self)

    def _count_lease(self, delta: int) -> None:
        with self._idle:
            self._leases += delta
            if self._leases == 0:
                self._idle.notify_all()

    def wait_unleased(self, timeout: float) -> bool:
        """Wait until no request holds the model; False if some still do after `timeout` s."""
        with self._idle:
            return self._idle.wait_for(lambda: self._leases == 0, timeout)


def load_model(package: str, config: ServeConfig, device: str, *, model_name: str,
               require_checksums: bool = False) -> ServedModel:
    """Fetch, verify and load `package` and start its engine thread."""
    started = time.monotonic()
    path = fetch_package(package, config.cache_dir)
    model, meta = load_package(path, device=device, require_checksums=require_checksums)
    if device == "cuda":
        model = model.to(torch.bfloat16)
    codec = Codec(path / TOKENIZER)
    identity = json.dumps({"package": package, "step": meta.get("step"), "files": meta.get("files")}, sort_keys=True)
    engine = Engine(model, eos_id=codec.eos_id, model_identity=identity, **config.engine.model_dump())
    engine_thread = EngineThread(engine)
    engine_thread.start()
    log.info("model_loaded", model=package, model_name=model_name, step=meta.get("step"), device=device,
             parameters=sum(p.numel() for p in model.parameters()), kv_cache_bytes=engine.cache.bytes,
             kv_cache_blocks=engine.cache.num_blocks,
             max_chars_per_token=codec.max_chars_per_token, seconds=round(time.monotonic() - started, 2))
    return ServedModel(package, path, meta.get("step"), codec, engine_thread, model.config.context_length)
