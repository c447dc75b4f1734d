"""What the routes depend on, as FastAPI dependencies over app.state (set by create_app): the
InferenceService (`ServiceDep`), the API-key check (`authorize`), and the ready model."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from lmforge.inference.api_errors import ApiError, not_ready
from lmforge.inference.auth import ApiKeys
from lmforge.inference.service import InferenceService, NotReady, ServedModel


async def get_service(request: Request) -> InferenceService:
    return request.app.state.service


ServiceDep = Annotated[InferenceService, Depends(get_service)]


def authorize(request: Request) -> None:
    """401 unless the request bears one of the API keys (when the server has any). A plain
    def: FastAPI runs it on a worker thread, since it may re-read the keys file."""
    api_keys: ApiKeys | None = request.app.state.api_keys
    if api_keys is not None and not api_keys.check(request.headers.get("authorization")):
        raise ApiError(401, "a valid API key is required: Authorization: Bearer <key>",
                       "authentication_error", headers={"WWW-Authenticate": "Bearer"}, code="invalid_api_key")


def ready_model(service: InferenceService, model: str | None, param: str | None = "model") -> ServedModel:
    """The current model, if it is ready and `model` is its name (None or "": the one served, as
    vLLM takes it)."""
    try:
        served = service.ensure_ready()
    except NotReady as exc:
        raise not_ready(exc) from exc
    if model and model != service.model_name:
        raise ApiError(404, f"model {model!r} not found; this server serves {service.model_name!r}",
                       param=param, code="model_not_found")
    return served
