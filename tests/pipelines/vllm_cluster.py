"""A vLLM inference Deployment in miniature, for the rollout's tests: the chart's own Deployment
(backend vllm) behind a fake Kubernetes API (AppsV1Api and CoreV1Api as far as
lmforge_pipelines.rollout.Cluster uses them), whose pods are real enough to matter:

- each new pod runs the chart's init container for real: `python -m lmforge.inference.fetch_model`
  (in-process) with the rendered arguments, so it resolves the model pointer in S3 and downloads
  and verifies the package, and its log is that command's output;
- then its `vllm serve` is a StandInVllm on the pod's own loopback address (127.0.0.N, the port
  the chart renders), serving the package the init container fetched: GET /health, GET /v1/models
  and POST /v1/completions, /v1 behind the first key of the API keys Secret, as vLLM does.

A restart (the strategic merge patch `kubectl rollout restart` sends) bumps the Deployment's
generation; the next read of it is the controller's first step (new pods, not ready yet, the old
ones still there); the read after that its last (new pods ready, old ones gone), unless `hold`.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from kubernetes.client import ApiClient

from lmforge.inference.fetch_model import CLI as FETCH
from lmforge_pipelines.vllm_pods import RESTARTED_AT

ADDRESSES = [f"127.0.0.{n}" for n in range(2, 6)]  # two replicas, old and new never share one


def typed(body: dict, kind: str):
    """The object as the real client returns it (V1Deployment, …), not a dict."""
    return ApiClient()._ApiClient__deserialize(copy.deepcopy(body), kind)


class StandInVllm:
    """vLLM's OpenAI server as far as a rollout talks to it, on one address. After a load it
    answers /health 503 for `loading` requests (the engine starting), then 200; completions of a
    package in `broken` fail as an engine error does (500). Every request is recorded."""

    def __init__(self, address: str, port: int, broken: set[str]):
        self.package = self.model = self.api_key = None
        self.loading, self.broken, self.requests = 0, broken, []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                stand_in.requests[-1]["status"] = status

            def do_GET(self):
                stand_in.requests.append({"path": self.path, "auth": self.headers.get("Authorization")})
                self._answer(None)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
                stand_in.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                self._answer(body)

            def _answer(self, body):
                if self.path == "/health":
                    if stand_in.package is None or stand_in.loading > 0:
                        stand_in.loading = max(stand_in.loading - 1, 0)
                        return self._send(503, {})
                    return self._send(200, {})
                if stand_in.api_key and self.headers.get("Authorization") != f"Bearer {stand_in.api_key}":
                    return self._send(401, {"error": "Unauthorized"})
                if self.path == "/v1/models":
                    return self._send(200, {"object": "list", "data": [{"id": stand_in.model, "object": "model",
                                                                         "root": "/models/served"}]})
                if self.path == "/v1/completions":
                    if body.get("model") != stand_in.model:
                        return self._send(404, {"error": {"message": f"The model `{body.get('model')}` does not "
                                                                     "exist.", "code": 404}})
                    if stand_in.package in stand_in.broken:
                        return self._send(500, {"error": {"message": "EngineCore encountered an issue.\nSee the "
                                                                     "logs.", "code": 500}})
                    return self._send(200, {"object": "text_completion", "model": stand_in.model,
                                            "choices": [{"index": 0, "text": " quick", "finish_reason": "length"}],
                                            "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
                return self._send(404, {"detail": "Not Found"})

        self.server = ThreadingHTTPServer((address, port), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def load(self, package: str | None, model: str | None = None, api_key: str | None = None,
             loading: int = 0) -> None:
        self.package, self.model, self.api_key, self.loading = package, model, api_key, loading

    def statuses(self, path: str) -> list[int]:
        return [r["status"] for r in self.requests if r["path"] == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class FakeVllmKubernetes:
    """The chart's vLLM Deployment `deployment` (rendered), its pods and its API keys Secret."""

    def __init__(self, deployment: dict, stand_ins: dict[str, StandInVllm], work: Path, keys_file: str,
                 loading: int = 2):
        self.deployment = copy.deepcopy(deployment)
        self.deployment["metadata"]["generation"] = 1
        self.name, self.namespace = deployment["metadata"]["name"], deployment["metadata"]["namespace"]
        self.stand_ins, self.work, self.keys_file, self.loading = stand_ins, work, keys_file, loading
        self.pods, self.logs, self.patches = [], {}, []
        self.hold, self.instant = False, False
        self.secret_error: Exception | None = None
        self._generation_seen = 0
        self._reconcile()
        self._finish()

    # -------------------------------------------------------------------------------- the API

    def read_namespaced_deployment(self, name, namespace):
        assert (name, namespace) == (self.name, self.namespace)
        if self._generation_seen < self.deployment["metadata"]["generation"]:
            self._reconcile()
        elif not self.hold:
            self._finish()
        return typed(self.deployment, "V1Deployment")

    def patch_namespaced_deployment(self, name, namespace, body):
        assert (name, namespace) == (self.name, self.namespace)
        self.patches.append(copy.deepcopy(body))
        annotations = body["spec"]["template"]["metadata"]["annotations"]
        template = self.deployment["spec"]["template"]["metadata"]
        template["annotations"] = {**(template.get("annotations") or {}), **annotations}
        self.deployment["metadata"]["generation"] += 1
        if self.instant:
            self._reconcile()
            self._finish()
        return typed(self.deployment, "V1Deployment")

    def list_namespaced_pod(self, namespace, label_selector):
        labels = self.deployment["spec"]["selector"]["matchLabels"]
        assert label_selector == ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        return typed({"items": self.pods}, "V1PodList")

    def read_namespaced_pod_log(self, name, namespace, container, tail_lines=None):
        assert container == "fetch-model", container
        lines = self.logs[name].splitlines()
        return "\n".join(lines[-tail_lines:] if tail_lines else lines)

    def read_namespaced_secret(self, name, namespace):
        if self.secret_error is not None:
            raise self.secret_error
        (volume,) = [v for v in self.deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "api-keys"]
        assert name == volume["secret"]["secretName"]
        key = volume["secret"]["items"][0]["key"]
        return typed({"metadata": {"name": name}, "data": {key: base64.b64encode(self.keys_file.encode()).decode()}},
                     "V1Secret")

    # -------------------------------------------------------------------------------- the controller

    def current(self) -> list[dict]:
        return [pod for pod in self.pods if not pod["metadata"].get("deletionTimestamp")]

    def serving(self) -> list[str | None]:
        """The package each ready pod's vLLM serves, pods in address order."""
        return [self.stand_ins[_ip(pod)].package for pod in sorted(self.pods, key=_ip) if _is_ready(pod)]

    def _reconcile(self) -> None:
        """The controller's first step: one new pod per replica, its init container run."""
        generation = self._generation_seen = self.deployment["metadata"]["generation"]
        template = self.deployment["spec"]["template"]
        for pod in [pod for pod in self.pods if not _is_ready(pod)]:  # a newer ReplicaSet scales an unfinished one to 0
            self.stand_ins[pod["status"]["podIP"]].load(None)
            self.pods.remove(pod)
        used = {pod["status"]["podIP"] for pod in self.pods}
        free = [address for address in ADDRESSES if address not in used]
        for index in range(self.deployment["spec"]["replicas"]):
            self.pods.append(self._start_pod(f"{self.name}-g{generation}-{index}", free[index], template))
        old = len(self.pods) - self.deployment["spec"]["replicas"]
        self.deployment["status"] = {"observedGeneration": generation, "replicas": len(self.pods),
                                     "updatedReplicas": self.deployment["spec"]["replicas"],
                                     "availableReplicas": old, "readyReplicas": old}

    def _start_pod(self, name: str, address: str, template: dict) -> dict:
        spec = template["spec"]
        (fetch,) = spec["initContainers"]
        (server,) = spec["containers"]
        args = list(fetch["args"])
        output = self.work / name / "served"
        args[args.index("--output") + 1] = str(output)
        log = io.StringIO()
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            code = FETCH.main(args)
        self.logs[name] = log.getvalue()
        meta = {"name": name, "namespace": self.namespace, "labels": dict(template["metadata"]["labels"]),
                "annotations": dict(template["metadata"].get("annotations") or {})}
        if code != 0:  # the kubelet restarts it; the pod stays in Init
            init = {"name": "fetch-model", "image": fetch["image"], "imageID": "", "ready": False, "restartCount": 2,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": code, "reason": "Error"}}}
            return {"metadata": meta, "status": {"phase": "Pending", "podIP": address, "initContainerStatuses": [init],
                                                 "conditions": [{"type": "Ready", "status": "False"}]}}
        source = json.loads((output / "lmforge-source.json").read_text())
        served = server["args"][server["args"].index("--served-model-name") + 1]
        self.stand_ins[address].load(source["package"], served, _first_key(self.keys_file), loading=self.loading)
        return {"metadata": meta, "status": {
            "phase": "Running", "podIP": address,
            "initContainerStatuses": [{"name": "fetch-model", "image": fetch["image"], "imageID": "", "ready": True,
                                       "restartCount": 0,
                                       "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}],
            "containerStatuses": [{"name": "inference", "image": server["image"], "imageID": "", "ready": False,
                                   "restartCount": 0, "state": {"running": {}}}],
            "conditions": [{"type": "Ready", "status": "False"}]}}

    def _finish(self) -> None:
        """The controller's last step: the new pods ready (those whose init container ran), the old gone."""
        stamp = (self.deployment["spec"]["template"]["metadata"].get("annotations") or {}).get(RESTARTED_AT)
        new = [pod for pod in self.pods if (pod["metadata"]["annotations"]).get(RESTARTED_AT) == stamp]
        if any(pod["status"]["phase"] != "Running" for pod in new):
            return
        for pod in self.pods:
            if pod not in new:
                self.stand_ins[pod["status"]["podIP"]].load(None)
        for pod in new:
            pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
            pod["status"]["containerStatuses"][0]["ready"] = True
        self.pods = new
        count = len(new)
        self.deployment["status"] = {"observedGeneration": self._generation_seen, "replicas": count,
                                     "updatedReplicas": count, "availableReplicas": count, "readyReplicas": count}


def _is_ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"]["conditions"])


def _ip(pod: dict) -> str:
    return pod["status"]["podIP"]


def _first_key(text: str) -> str | None:
    return next((line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")), None)
