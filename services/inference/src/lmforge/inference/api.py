"""The HTTP layer (FastAPI): OpenAI-compatible completions and chat completions with SSE streaming, scoring,
tracing text back to the training data, model list, health, readiness and metrics. It validates, authenticates
and translates; generation itself is the service's and the engine's business (the split of vLLM's API server and
engine).

create_app only wires: the routers (routes/: completions, chat, score, trace, models, health), the
InferenceService and API keys they reach through dependencies (app.state), the error handlers
(api_errors.py) and the middleware (middleware.py).

Errors are OpenAI-shaped, `{"error": {"message", "type", "param", "code"}}`, and never carry
a stack trace: 400 bad JSON, invalid fields or a prompt that does not fit, 401 no valid key,
404 unknown model, 413 body too large, 429 queue full (with Retry-After), 503 not ready, 504 a
trace that took too long; anything unexpected is logged with its trace id and answered 500."""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import FastAPI

from lmforge.inference.api_errors import ERROR_HANDLERS
from lmforge.inference.auth import ApiKeys
from lmforge.inference.middleware import BodyLimit, CountRequests
from lmforge.inference.routes import chat, completions, health, models, score, trace
from lmforge.inference.service import InferenceService


def create_app(service: InferenceService) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        # Stop the engine while the server shuts down gracefully: uvicorn ends the process with the
        # signal it caught right after, before any code after its run() would run.
        await asyncio.to_thread(service.stop)

    config = service.config
    docs = config.api_docs  # the API's description, served without authentication when on
    app = FastAPI(title="lmforge inference", version="0.1.0", openapi_url="/openapi.json" if docs else None,
                  docs_url="/docs" if docs else None, redoc_url="/redoc" if docs else None,
                  exception_handlers=ERROR_HANDLERS, lifespan=lifespan)
    app.state.service = service
    app.state.api_keys = ApiKeys(config.api_keys_file) if config.api_keys_file else None
    app.state.trace = service.trace
    app.state.trace_tokenizer = trace.served_tokenizer(service)

    app.include_router(health.router)
    if config.metrics_port is None:  # else the metrics have a port of their own (cli.py)
        app.include_router(health.metrics_router)
    app.include_router(models.router)
    app.include_router(completions.router)
    app.include_router(chat.router)
    app.include_router(score.router)
    app.include_router(trace.router)

    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    app.add_middleware(CountRequests, metrics=service.metrics)  # added last: the outermost
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(app, tracer_provider=service.tracer_provider,
                                       excluded_urls="healthz,readyz,metrics", exclude_spans=["receive", "send"])
    return app
