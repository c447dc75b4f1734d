"""What a rollout reads off a vLLM inference Deployment and its pods (inference.backend vllm).

vLLM loads its model once and does not follow the model pointer, so the rollout
(lmforge_pipelines.rollout.Cluster) restarts such a Deployment after moving the pointer, as
`kubectl rollout restart` does: it stamps the pod template's kubectl.kubernetes.io/restartedAt
annotation, the Deployment rolls its pods, and each new pod's init container (fetch-model)
resolves the pointer anew. This module holds the pieces of that with no Kubernetes client in
them, so they read plain dicts:

- the chart's marks: the Deployment's lmforge.io/inference-backend annotation, the
  --served-model-name argument, the API keys Secret it mounts;
- how far a restart is: `kubectl rollout status`'s rule (rollout_waits_for), a new pod that will
  never start (pod_failure: its fetch-model exited 2 or 3, a crash loop), what the others wait on;
- which package a new pod fetched (its fetch-model log's model_fetched line);
- whether a replica serves (probe_replica): /health 200, the served name in /v1/models, and a
  first completion (/v1/completions, one token) answered, with the API key when there is one.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime

BACKEND_ANNOTATION = "lmforge.io/inference-backend"
RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
FETCH_CONTAINER = "fetch-model"
API_KEYS_VOLUME = "api-keys"
# fetch_model's exit codes that no retry changes: not a Hugging Face package (2), bad input (3).
FETCH_REFUSED = {2: "not a Hugging Face format package", 3: "the package does not verify or is missing"}
# Container waiting reasons that do not clear by themselves.
STUCK = frozenset({"CrashLoopBackOff", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError"})
PROMPT = "The"


def is_vllm(deployment: dict) -> bool:
    return ((deployment.get("metadata") or {}).get("annotations") or {}).get(BACKEND_ANNOTATION) == "vllm"


def restart_stamp() -> str:
    # Microseconds, where kubectl writes seconds: a rollback right after a rollout must change the template.
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def restart_patch(stamp: str) -> dict:
    """The strategic merge patch `kubectl rollout restart` sends."""
    return {"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: stamp}}}}}


def _container(deployment: dict, name: str) -> dict:
    spec = deployment["spec"]["template"]["spec"]
    return next((c for c in spec.get("containers") or [] if c["name"] == name), {})


def served_model_name(deployment: dict, container: str) -> str | None:
    """The name vLLM serves the model as (its --served-model-name argument)."""
    args = _container(deployment, container).get("args") or []
    return args[args.index("--served-model-name") + 1] if "--served-model-name" in args[:-1] else None


def api_key_secret(deployment: dict) -> tuple[str, str] | None:
    """(Secret name, key) of the API keys file the pods mount, or None (no authentication)."""
    for volume in deployment["spec"]["template"]["spec"].get("volumes") or []:
        secret = volume.get("secret")
        if volume["name"] == API_KEYS_VOLUME and secret:
            items = secret.get("items") or []
            return secret["secretName"], (items[0]["key"] if items else "keys")
    return None


def first_key(text: str) -> str | None:
    """The key vLLM takes from a keys file: its first non-blank line not starting with '#'."""
    return next((line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")),
                None)


# ------------------------------------------------------------------------------ the restart


def deadline_exceeded(deployment: dict) -> str | None:
    """The controller's verdict that the rollout is stuck (progressDeadlineSeconds), if given."""
    for condition in (deployment.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Progressing" and condition.get("reason") == "ProgressDeadlineExceeded":
            return condition.get("message") or "ProgressDeadlineExceeded"
    return None


def rollout_waits_for(deployment: dict) -> str | None:
    """What the rollout still waits for, or None once it is complete (`kubectl rollout status`:
    the controller saw the change, every replica is updated and available, no old one is left)."""
    status = deployment.get("status") or {}
    if (status.get("observedGeneration") or 0) < (deployment["metadata"].get("generation") or 0):
        return "the Deployment controller has not seen the restart yet"
    desired = deployment["spec"].get("replicas", 1)
    updated = status.get("updatedReplicas") or 0
    if updated < desired:
        return f"{updated} of {desired} replica(s) updated"
    total = status.get("replicas") or 0
    if total > updated:
        return f"{total - updated} old replica(s) still terminating"
    available = status.get("availableReplicas") or 0
    if available < updated:
        return f"{available} of {updated} updated replica(s) available"
    return None


def pod_failure(pod: dict) -> str | None:
    """Why the pod will not start without another change, or None."""
    status = pod.get("status") or {}
    for container in status.get("initContainerStatuses") or []:
        for state in (container.get("state") or {}, container.get("lastState") or {}):
            code = (state.get("terminated") or {}).get("exitCode")
            if container["name"] == FETCH_CONTAINER and code in FETCH_REFUSED:
                return f"its init container {FETCH_CONTAINER} exited {code} ({FETCH_REFUSED[code]})"
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK:
            return f"container {container['name']}: {waiting['reason']} {waiting.get('message') or ''}".rstrip()
    return None


def pod_waiting(pod: dict) -> str:
    """What a pod that is not ready waits on, in a few words."""
    status = pod.get("status") or {}
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        state = container.get("state") or {}  # {"running": {}} when the API gives no startedAt
        if "waiting" in state:
            return f"{container['name']} {(state['waiting'] or {}).get('reason') or 'waiting'}"
        if "running" in state and not container.get("ready", True):
            return f"{container['name']} running, not ready"
    return status.get("phase") or "pending"


def fetched_package(log: str) -> str | None:
    """The package fetch-model fetched, from its log's model_fetched line."""
    for line in reversed(log.splitlines()):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == "model_fetched":
            return event.get("package")
    return None


# ------------------------------------------------------------------------------ a replica


@dataclass(frozen=True)
class Probe:
    """A replica's answer: ok; final (an answer no wait changes: a refused key, a missing model,
    a 4xx); and what it said."""

    ok: bool
    final: bool
    said: str


def _call(url: str, api_key: str | None, body: dict | None, timeout_s: float) -> tuple[int | None, object, str]:
    """(HTTP status or None when unreachable, parsed JSON body or None, a short reason)."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers)  # noqa: S310 - http(s) URLs
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    except (OSError, ValueError) as exc:
        return None, None, f"unreachable ({exc})"
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = None
    reason = raw.decode(errors="replace") if status >= 300 else ""
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        reason = str(parsed["error"].get("message", reason))
    return status, parsed, " ".join(reason.split())[:200]  # one line, whatever the server sent


def probe_replica(url: str, model: str, api_key: str | None, timeout_s: float = 30.0) -> Probe:
    """Whether the vLLM replica at `url` serves `model`: /health, /v1/models, a one-token completion."""
    status, _, reason = _call(f"{url}/health", None, None, timeout_s)
    if status != 200:
        return Probe(False, False, f"/health {status or ''} {reason}".replace("  ", " ").strip())
    status, body, reason = _call(f"{url}/v1/models", api_key, None, timeout_s)
    if status != 200:
        return Probe(False, status is not None and 400 <= status < 500, f"/v1/models {status or ''} {reason}".strip())
    names = [m.get("id") for m in (body or {}).get("data") or [] if isinstance(m, dict)]
    if model not in names:
        return Probe(False, True, f"/v1/models lists {names}, not {model!r}")
    completion = {"model": model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    status, body, reason = _call(f"{url}/v1/completions", api_key, completion, timeout_s)
    if status != 200:
        final = status is not None and 400 <= status < 500 and status != 429
        return Probe(False, final, f"/v1/completions {status or ''} {reason}".strip())
    choices = (body or {}).get("choices") if isinstance(body, dict) else None
    if not choices or not isinstance(choices[0].get("text"), str):
        return Probe(False, True, f"/v1/completions answered 200 without a completion: {str(body)[:200]}")
    return Probe(True, False, f"completed {choices[0]['text']!r}")
