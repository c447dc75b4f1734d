"""Probes and metrics, without authentication: /healthz (the process answers and its engine has
not broken: the liveness probe, a restart mends it), /readyz (the model is loaded and its engine
runs) and /metrics (when not on a port of its own)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from lmforge.inference.routes.deps import ServiceDep

router = APIRouter()
metrics_router = APIRouter()


@router.get("/healthz")
def healthz(service: ServiceDep):
    reason = service.liveness()
    if reason is not None:
        return JSONResponse({"status": "failed", "reason": reason}, status_code=503)
    return {"status": "alive"}


@router.get("/readyz")
def readyz(service: ServiceDep):
    served = service.model
    reason = service.readiness(served)
    if reason is not None:
        return JSONResponse({"status": "not ready", "reason": reason}, status_code=503)
    return {"status": "ready", "model": service.model_name, "package": served.package,
            "engine_pid": served.engine.info.pid}


@metrics_router.get("/metrics")
def metrics(service: ServiceDep):
    return PlainTextResponse(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)
