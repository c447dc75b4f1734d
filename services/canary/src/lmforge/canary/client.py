"""HTTP client of the deployed inference endpoint (lmforge-serve's OpenAI-compatible API).

Connection errors, timeouts, 429 and 5xx are retried by the one retry policy
(lmforge.common.retry: exponential backoff with full jitter, Retry-After honoured, capped);
what is left maps onto the CLI's exit codes:
- unreachable, or still failing after the retries: EndpointError (exit 4);
- 401/403 (missing or wrong API key), or a model the endpoint does not serve: ConfigError (2);
- 400/422 for one eval item (a text or prompt that does not fit the model): InputError (3);
- 404, or 503 still after the retries, from POST /v1/trace (a server without a trace index, or one
  still loading it): RouteUnavailable, which the memorization measurement reports as "not traced"."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from lmforge.canary.config import HttpSection
from lmforge.common.errors import ConfigError, InputError, LmforgeError
from lmforge.common.logging import get_logger
from lmforge.common.retry import describe

API_KEY_ENV = "LMFORGE_CANARY_API_KEY"
RETRIED_STATUS = frozenset({429, 500, 502, 503, 504})
TRACE_UNAVAILABLE_STATUS = frozenset({404, 503})

log = get_logger("canary")


class EndpointError(LmforgeError):
    """The inference endpoint cannot be reached or keeps failing."""

    exit_code = 4


class RouteUnavailable(LmforgeError):
    """The endpoint does not offer an optional route (its message: the status and the server's reason)."""

    exit_code = 4


def resolve_api_key(key_file: str | None, environ=None) -> str | None:
    """The key from `key_file` (its first non-blank line not starting with '#'), else from
    LMFORGE_CANARY_API_KEY, else None (no Authorization header)."""
    environ = os.environ if environ is None else environ
    if key_file:
        try:
            lines = Path(key_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--api-key-file {key_file}: cannot read: {exc}") from exc
        keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        if not keys:
            raise ConfigError(f"--api-key-file {key_file}: holds no key")
        return keys[0]
    return environ.get(API_KEY_ENV, "").strip() or None


def _error_message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:300] or response.reason_phrase


def _retry_after(exc: BaseException) -> float | None:
    """The server's Retry-After (seconds) on a retried status."""
    if isinstance(exc, httpx.HTTPStatusError):
        retry_after = exc.response.headers.get("retry-after", "")
        if retry_after.isdigit():
            return float(retry_after)
    return None


class InferenceClient:
    def __init__(self, endpoint: str, http: HttpSection, api_key: str | None = None, model: str | None = None,
                 trace_endpoint: str | None = None):
        self.endpoint = endpoint.rstrip("/")
        if not self.endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"--endpoint {endpoint!r}: expected an http(s):// URL")
        # /v1/trace's server: the endpoint itself (lmforge-serve), or the trace service beside a vLLM backend
        self.trace_url = f"{(trace_endpoint or self.endpoint).rstrip('/')}/v1/trace"
        if not self.trace_url.startswith(("http://", "https://")):
            raise ConfigError(f"memorization.endpoint {trace_endpoint!r}: expected an http(s):// URL")
        self.http, self.model = http, model
        headers = {"User-Agent": "lmforge-canary/0.1"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.client = httpx.Client(base_url=self.endpoint, headers=headers, timeout=httpx.Timeout(
            http.read_timeout_seconds, connect=http.connect_timeout_seconds))

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> InferenceClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- transport --------------------------------------------------------------------------

    def _send(self, method: str, path: str, **kwargs) -> httpx.Response:
        """One try; a retried status (429, 5xx) raises httpx.HTTPStatusError."""
        response = self.client.request(method, path, **kwargs)
        if response.status_code in RETRIED_STATUS:
            raise httpx.HTTPStatusError(f"HTTP {response.status_code}: {_error_message(response)}",
                                        request=response.request, response=response)
        return response

    def request(self, method: str, path: str, item: str | None = None, unavailable: frozenset[int] = frozenset(),
                **kwargs) -> Any:
        """The JSON body of a 2xx answer; see the module docstring for the errors. A status in `unavailable`
        (an optional route the server does not offer) raises RouteUnavailable, after the retries if retried."""
        url = path if path.startswith(("http://", "https://")) else f"{self.endpoint}{path}"
        retry = self.http.policy(retryable=lambda exc: isinstance(exc, httpx.HTTPError), wait_at_least=_retry_after,
                                 log=log, event="request_retry")
        try:
            # httpx.HTTPError: connection refused, DNS, timeouts, broken connections, a retried status
            response = retry.call(f"{method} {url}", lambda: self._send(method, path, **kwargs), url=url)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code in unavailable:
                raise RouteUnavailable(str(exc)) from exc
            raise EndpointError(f"{method} {url} failed after {retry.attempts} attempt(s): {exc}") from exc
        except httpx.HTTPError as exc:
            raise EndpointError(f"cannot reach {url} after {retry.attempts} attempt(s): {describe(exc)}") from exc
        status = response.status_code
        if status in unavailable:
            raise RouteUnavailable(f"HTTP {status}: {_error_message(response)}")
        if status in (401, 403):
            raise ConfigError(f"{url}: HTTP {status}: {_error_message(response)} (pass the key with --api-key-file "
                              f"or {API_KEY_ENV})")
        if status == 404 and self.model is not None and "model" in _error_message(response):
            raise ConfigError(f"{url}: {_error_message(response)} (config `model`)")
        if status in (400, 413, 422) and item is not None:
            raise InputError(f"{item}: the endpoint rejected it: HTTP {status}: {_error_message(response)}")
        if status >= 300:
            raise EndpointError(f"{method} {url}: HTTP {status}: {_error_message(response)}")
        try:
            return response.json()
        except ValueError as exc:
            raise EndpointError(f"{method} {url}: the answer is not JSON: {response.text[:200]!r}") from exc

    # -- the API ----------------------------------------------------------------------------

    def model_name(self) -> str:
        """The model under test: config `model` (checked against GET /v1/models), else the
        first model the endpoint serves."""
        body = self.request("GET", "/v1/models")
        try:
            served = [entry["id"] for entry in body["data"]]
        except (KeyError, TypeError) as exc:
            raise EndpointError(f"{self.endpoint}/v1/models: unexpected answer {str(body)[:200]}") from exc
        if not served:
            raise EndpointError(f"{self.endpoint}/v1/models: the endpoint serves no model")
        if self.model is not None:
            if self.model not in served:
                raise ConfigError(f"model {self.model!r} is not served by {self.endpoint} (it serves {served})")
            return self.model
        return served[0]

    def _with_model(self, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "model": self.model} if self.model is not None else body

    def score(self, text: str, item: str) -> list[float]:
        """The logprob of each token of `text` after the first, through POST /v1/completions with
        `echo` and `logprobs`, as lm-evaluation-harness scores: lmforge-serve and vLLM both serve it.
        One token is generated (some servers refuse max_tokens 0) and left out, by the usage's
        prompt token count."""
        request = {"prompt": text, "max_tokens": 1, "echo": True, "logprobs": 0, "temperature": 0}
        body = self.request("POST", "/v1/completions", item=item, json=self._with_model(request))
        try:
            prompt_tokens = int(body["usage"]["prompt_tokens"])
            logprobs = [float(lp) for lp in body["choices"][0]["logprobs"]["token_logprobs"][1:prompt_tokens]]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise EndpointError(f"{self.endpoint}/v1/completions: unexpected answer for {item}: "
                                f"{str(body)[:200]}") from exc
        if not logprobs:
            raise EndpointError(f"{self.endpoint}/v1/completions: no scored tokens for {item}")
        return logprobs

    def complete(self, prompt: str, max_tokens: int, stop: list[str], item: str) -> tuple[str, str | None]:
        """POST /v1/completions, greedy: (text, finish_reason)."""
        request = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": 0}
        if stop:
            request["stop"] = stop
        body = self.request("POST", "/v1/completions", item=item, json=self._with_model(request))
        try:
            choice = body["choices"][0]
            return str(choice["text"]), choice.get("finish_reason")
        except (KeyError, IndexError, TypeError) as exc:
            raise EndpointError(f"{self.endpoint}/v1/completions: unexpected answer for {item}: "
                                f"{str(body)[:200]}") from exc

    def trace(self, text: str, min_span_tokens: int, max_documents: int) -> dict[str, Any]:
        """POST /v1/trace with every maximal span (span_density 1): the spans of `text` of at least
        `min_span_tokens` tokens found verbatim in the training data, each with up to `max_documents`
        source documents. RouteUnavailable when the server has no trace index (404) or it is not ready (503)."""
        request = {"text": text, "min_span_tokens": min_span_tokens, "max_documents": max_documents,
                   "span_density": 1}
        return self.request("POST", self.trace_url, unavailable=TRACE_UNAVAILABLE_STATUS,
                            json=self._with_model(request))
