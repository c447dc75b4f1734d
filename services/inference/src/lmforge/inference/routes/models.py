"""GET /v1/models and GET /v1/models/{id}: the one model this server serves, OpenAI-shaped.
`root` is the served name, as the id: the package's path or URI is not shown to API clients."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from lmforge.inference.routes.deps import ServiceDep, authorize, ready_model
from lmforge.inference.service import InferenceService, ServedModel

router = APIRouter(dependencies=[Depends(authorize)])


def _card(service: InferenceService, served: ServedModel) -> dict:
    return {"id": service.model_name, "object": "model", "created": int(served.loaded_at), "owned_by": "lmforge",
            "root": service.model_name, "parent": None, "max_model_len": served.context_length}


@router.get("/v1/models")
def models(service: ServiceDep):
    return {"object": "list", "data": [_card(service, ready_model(service, None))]}


@router.get("/v1/models/{model_id:path}")
def model(model_id: str, service: ServiceDep):
    """The client's models.retrieve; 404 for any other id."""
    return _card(service, ready_model(service, model_id, param=None))

