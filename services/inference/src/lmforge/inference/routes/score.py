"""POST /v1/score: the log-probability of each token of a text after the first, and its
perplexity (the canary's measure). A text too long for the context is refused by its length in
characters before it is tokenized."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from lmforge.inference.api_errors import ApiError, not_ready
from lmforge.inference.routes.deps import ServiceDep, authorize, ready_model
from lmforge.inference.schemas import Score, ScoreRequest
from lmforge.inference.service import NotReady

router = APIRouter(dependencies=[Depends(authorize)])


@router.post("/v1/score")
async def score(body: ScoreRequest, service: ServiceDep):
    with ready_model(service, body.model).lease() as served:
        if not served.codec.may_fit(body.text, served.context_length):
            raise ApiError(400, f"text: {len(body.text)} characters make more than {served.context_length} "
                                f"tokens (a token spans at most {served.codec.max_chars_per_token} characters); "
                                f"scoring needs 2 to {served.context_length}", param="text")
        ids = await service.encode(served, body.text)
        if not 2 <= len(ids) <= served.context_length:
            raise ApiError(400, f"text: has {len(ids)} tokens; scoring needs 2 to {served.context_length}",
                           param="text")
        try:
            logprobs, perplexity = await service.score(served, ids)
        except NotReady as exc:
            raise not_ready(exc) from exc
        return Score(model=service.model_name, tokens=await service.token_texts(served, ids), token_ids=ids,
                     token_logprobs=[None, *logprobs], total_logprob=sum(logprobs), perplexity=perplexity)
