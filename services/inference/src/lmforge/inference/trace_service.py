"""The standalone trace service: POST /v1/trace without a model, for servers that have no such route (the
chart runs it beside vLLM, as the `trace` container; docs/inference.md).

    python -m lmforge.inference.trace_service --set trace.index=s3://BUCKET/datasets/NAME/trace-index \\
        [--set api_keys_file=/keys] [--config serve.yaml] [--host 0.0.0.0] [--port 8001]

It takes lmforge-serve's configuration (ServeConfig: its trace.* section, api_keys_file, host, port,
max_body_bytes, model_name; the model is not loaded) and serves lmforge-serve's own /v1/trace router
(routes/trace.py) with the same API-key check, over the index's own tokenizer.json: a text is tokenized as
the training data was, so it traces whatever model was trained on that data. The request's `model` is not
checked, and the answer's `model` is model_name (default: the last segment of `model`, else "trace").

/healthz answers while the process serves, also while the index downloads (/v1/trace answers 503 until it
is loaded, with the reason, and after a failed load); /readyz answers 200 once the index is loaded; /metrics
has the trace series (lmforge_inference_trace_*). `trace: true` on completions needs the model and the index
in one server: lmforge-serve's; a vLLM client traces the completion's text here instead.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from lmforge.common.cli import ServiceCli
from lmforge.common.errors import ConfigError
from lmforge.common.logging import get_logger
from lmforge.common.metrics import new_registry
from lmforge.common.storage import sha256_file
from lmforge.inference.api_errors import ERROR_HANDLERS, ApiError
from lmforge.inference.auth import ApiKeys
from lmforge.inference.config import ServeConfig, load_serve_config
from lmforge.inference.metrics import TraceMetrics
from lmforge.inference.middleware import BodyLimit
from lmforge.inference.routes import trace
from lmforge.inference.served_model import default_model_name
from lmforge.inference.text import Codec
from lmforge.inference.trace_runner import TraceRunner
from lmforge.trace.format import TOKENIZER

log = get_logger("inference")


class IndexTokenizer:
    """The index's tokenizer.json, read once the index is loaded (trace.TokenizerSource)."""

    def __init__(self, runner: TraceRunner, model_name: str):
        self.runner, self.model_name = runner, model_name
        self.tokenizer: trace.TraceTokenizer | None = None

    def load(self) -> None:
        """The runner's load, then the tokenizer beside the index (its absence is the index's load error)."""
        self.runner.load()
        index = self.runner.index
        if index is None:
            return
        path = index.root / TOKENIZER
        try:
            self.tokenizer = trace.TraceTokenizer(Codec(path), sha256_file(path), self.model_name)
        except Exception as exc:  # noqa: BLE001 - reported by /v1/trace and /readyz
            self.runner.index, self.runner.load_error = None, ConfigError(f"{path}: cannot read the tokenizer ({exc})")
            self.runner.metrics.set_index(0, 0, 0)  # no index is served
            log.error("trace_tokenizer_unreadable", path=str(path), error=str(exc))

    def not_ready(self) -> str:
        """Why no trace can run yet (the runner's index may be loaded before its tokenizer is read)."""
        return self.runner.readiness(None) if self.runner.load_error is not None else "the trace index is loading"

    @contextlib.contextmanager
    def __call__(self, model: str | None) -> Iterator[trace.TraceTokenizer]:
        if self.tokenizer is None:
            reason = self.not_ready()
            loading = self.runner.load_error is None
            raise ApiError(503, reason, "service_unavailable", headers={"Retry-After": "5"} if loading else None,
                           code="trace_index_loading" if loading else "trace_index_unavailable")
        yield self.tokenizer


def create_trace_app(config: ServeConfig) -> tuple[FastAPI, IndexTokenizer]:
    """The service's app, and what loads its index (IndexTokenizer.load: the caller runs it, in the background)."""
    if not config.trace.index:
        raise ConfigError("no trace index: set trace.index (a data-prep output's trace-index/, a directory or s3://)")
    model_name = config.model_name or (default_model_name(config.model) if config.model else "trace")
    registry = new_registry()
    runner = TraceRunner(config.trace, TraceMetrics(registry, model_name))
    tokenizer = IndexTokenizer(runner, model_name)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        runner.stop()

    app = FastAPI(title="lmforge trace", version="0.1.0", openapi_url="/openapi.json" if config.api_docs else None,
                  docs_url="/docs" if config.api_docs else None, redoc_url=None, exception_handlers=ERROR_HANDLERS,
                  lifespan=lifespan)
    app.state.api_keys = ApiKeys(config.api_keys_file) if config.api_keys_file else None
    app.state.trace = runner
    app.state.trace_tokenizer = tokenizer

    @app.get("/healthz")
    def healthz():
        return {"status": "alive"}

    @app.get("/readyz")
    def readyz():
        if tokenizer.tokenizer is None:
            return JSONResponse({"status": "not ready", "reason": tokenizer.not_ready()}, status_code=503)
        return {"status": "ready", "index": config.trace.index, "tokens": runner.index.tokens}

    @app.get("/metrics")
    def metrics():
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(trace.router)
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    return app, tokenizer


def serve(args: argparse.Namespace, config: ServeConfig) -> int:
    import threading

    import uvicorn

    from lmforge.inference.cli import _listen

    app, tokenizer = create_trace_app(config)
    listener = _listen(config.host, config.port)
    threading.Thread(target=tokenizer.load, name="lmforge-trace-load", daemon=True).start()
    log.info("trace_serving", url=f"http://{config.host}:{config.port}", index=config.trace.index)
    uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning", access_log=False,
                                  timeout_graceful_shutdown=10)).run(sockets=[listener])
    return 0


CLI = ServiceCli("python -m lmforge.inference.trace_service", service="inference", description=__doc__,
                 name="trace_service", load_config=load_serve_config, flag_fields=("host", "port"))
_parser = CLI.command(None, serve, config="load")
_parser.add_argument("--host", help="bind address (default 0.0.0.0)")
_parser.add_argument("--port", type=int, help="port (default 8000)")
main = CLI.main

if __name__ == "__main__":
    raise SystemExit(main())
