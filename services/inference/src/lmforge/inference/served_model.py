"""One loaded model package and the engine serving it (`ServedModel`), how it is loaded
(`load_model`), and the leases requests hold on it: a model swapped out (model_swap) is stopped
only once the last request that started on it has returned its lease. What both the service and
the pointer follower use, so that neither imports the other for it."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from lmforge.common.logging import get_logger
from lmforge.common.storage import sha256_file
from lmforge.inference.config import ServeConfig
from lmforge.inference.engine_client import EngineClient
from lmforge.inference.engine_core import EngineSpec
from lmforge.inference.text import Codec
from lmforge.model.package import TOKENIZER, fetch_package

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
    """One loaded package and the engine serving it."""

    package: str  # the package URI it was loaded from
    path: Path  # its local copy (a download for s3://)
    step: int | None
    codec: Codec
    engine: EngineClient
    context_length: int
    tokenizer_sha256: str | None = None  # of its tokenizer.json: a trace index must have been built with the same
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
    """Fetch `package`, start its engine (which verifies and loads it) and read its tokenizer."""
    started = time.monotonic()
    path = fetch_package(package, config.cache_dir)
    spec = EngineSpec(package, str(path), device, config.engine.model_dump(), require_checksums=require_checksums)
    engine = EngineClient(spec, layout=config.engine_layout)
    info = engine.start()
    try:
        codec = Codec(path / TOKENIZER)
    except BaseException:
        engine.stop()
        raise
    with open(path / "config.json") as file:
        step = json.load(file).get("step")
    log.info("model_loaded", model=package, model_name=model_name, step=step, device=device,
             parameters=info.parameters, kv_cache_bytes=info.kv_cache_bytes, kv_cache_blocks=info.kv_cache_blocks,
             engine_layout=config.engine_layout, engine_pid=info.pid,
             max_chars_per_token=codec.max_chars_per_token, seconds=round(time.monotonic() - started, 2))
    return ServedModel(package, path, step, codec, engine, info.context_length, sha256_file(path / TOKENIZER))
