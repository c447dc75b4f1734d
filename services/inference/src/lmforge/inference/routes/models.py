"""GET /v1/models: the one model this server serves, OpenAI-shaped."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from lmforge.inference.routes.deps import ServiceDep, authorize, ready_model

router = APIRouter(dependencies=[Depends(authorize)])


@router.get("/v1/models")
def models(service: ServiceDep):
    served = ready_model(service, None)
    return {"object": "list", "data": [{
        "id": service.model_name, "object": "model", "created": int(served.loaded_at), "owned_by": "lmforge",
        "root": served.package, "max_model_len": served.context_length}]}
