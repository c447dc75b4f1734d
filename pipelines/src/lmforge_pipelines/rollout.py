"""Roll the inference Deployment to a new model package and wait for the rollout.

The chart's inference container runs `lmforge-serve --model URI …`; the rollout replaces the
value after `--model` (the rest of the args stay as the chart rendered them), records the URI in
the pod template's `lmforge.io/model` annotation, and stamps `lmforge.io/rolled-at` so that the
pods restart even when the URI is unchanged (a re-export to the same version). The Deployment's
own strategy (maxUnavailable 0, readiness on /readyz) then swaps the replicas.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

MODEL_ANNOTATION = "lmforge.io/model"
ROLLED_AT_ANNOTATION = "lmforge.io/rolled-at"


class RolloutFailed(RuntimeError):
    pass


def _as_dict(obj: Any) -> dict:
    if isinstance(obj, dict):
        return obj
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(obj)


def model_patch(deployment: dict, model_uri: str, *, container: str = "inference", now: datetime | None = None) -> dict:
    """The strategic-merge patch that points `container` of `deployment` at `model_uri`."""
    containers = deployment["spec"]["template"]["spec"]["containers"]
    found = next((c for c in containers if c["name"] == container), None)
    if found is None:
        names = [c["name"] for c in containers]
        raise RolloutFailed(f"Deployment {deployment['metadata']['name']}: no container {container!r} (has {names})")
    args = list(found.get("args") or [])
    if "--model" in args and args.index("--model") + 1 < len(args):
        args[args.index("--model") + 1] = model_uri
    else:
        args = ["--model", model_uri, *[a for a in args if not a.startswith("--model=")]]
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"spec": {"template": {
        "metadata": {"annotations": {MODEL_ANNOTATION: model_uri, ROLLED_AT_ANNOTATION: stamp}},
        # Containers merge by name; `args` is replaced as a whole.
        "spec": {"containers": [{"name": container, "args": args}]},
    }}}


def rollout_done(deployment: dict) -> tuple[bool, str]:
    """(done, why not) the way `kubectl rollout status` decides it."""
    meta, spec, status = deployment["metadata"], deployment.get("spec") or {}, deployment.get("status") or {}
    want = spec.get("replicas", 1)
    if status.get("observedGeneration", 0) < meta.get("generation", 0):
        return False, "waiting for the controller to observe the new spec"
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Progressing" and condition.get("reason") == "ProgressDeadlineExceeded":
            raise RolloutFailed(f"Deployment {meta['name']}: {condition.get('message', 'progress deadline exceeded')}")
    updated, total = status.get("updatedReplicas", 0), status.get("replicas", 0)
    available = status.get("availableReplicas", 0)
    if updated < want:
        return False, f"{updated} of {want} replicas updated"
    if total > updated:
        return False, f"{total - updated} old replicas pending termination"
    if available < updated:
        return False, f"{available} of {updated} updated replicas available"
    return True, ""


def roll_deployment(apps, namespace: str, name: str, model_uri: str, *, container: str = "inference",
                    timeout_s: float, poll_s: float = 5.0, clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep, log: Callable[[str], None] = print) -> dict:
    """Patch Deployment namespace/name (an AppsV1Api or a fake as `apps`) to serve `model_uri`,
    then wait up to `timeout_s` until every replica runs it. Returns the patch applied."""
    deployment = _as_dict(apps.read_namespaced_deployment(name, namespace))
    patch = model_patch(deployment, model_uri, container=container)
    apps.patch_namespaced_deployment(name, namespace, patch)
    log(f"Deployment {namespace}/{name}: rolling to {model_uri}")
    deadline = clock() + timeout_s
    while True:
        done, why = rollout_done(_as_dict(apps.read_namespaced_deployment_status(name, namespace)))
        if done:
            log(f"Deployment {namespace}/{name}: serving {model_uri}")
            return patch
        if clock() >= deadline:
            raise RolloutFailed(f"Deployment {namespace}/{name} did not finish rolling out in {timeout_s:g} s: {why}")
        sleep(poll_s)


def apps_api():
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.AppsV1Api()
