"""Roll the inference service to a new model package: verify the package, point the model pointer
at it, wait until every serving replica reports it, run the canary against it, and roll back
(the pointer to its previous value) when the canary fails.

Why a pointer: the chart's inference Deployment names the pointer (`inference.model`, e.g.
s3://BUCKET/PREFIX/models/current), never a package, so `helm upgrade` renders the same `--model`
whatever was rolled out since, and the package served is decided by the pointer alone. The
lmforge-serve replicas follow it and swap in place (lmforge.inference.model_swap): nothing restarts.

On Kubernetes (`Cluster`) the step reads the Deployment (its pod selector and port), its ready
pods (each one's /readyz says which package it serves), the canary CronJob; and creates one Job
from the CronJob's jobTemplate, as `kubectl create job --from=cronjob/…` does.

vLLM (a Deployment the chart marks lmforge.io/inference-backend: vllm) loads its model once and
does not follow the pointer. There the step restarts the Deployment after moving the pointer, as
`kubectl rollout restart` does (the one write to it: the pod template's restartedAt annotation,
which `helm upgrade` leaves alone, having never rendered it), waits until the rollout completes,
checks that each new pod's init container fetched the package, then that each new pod answers:
/health 200, its served name in /v1/models, a first one-token completion (with the API key from
--api-key-file, else from the Secret the pods mount). New pods that do not serve the package
(lmforge_pipelines.vllm_pods) move the pointer back and restart again, as a failed canary does.

    python -m lmforge_pipelines.rollout show POINTER
    python -m lmforge_pipelines.rollout set POINTER PACKAGE [--namespace NS --deployment NAME [--canary-cronjob NAME]
                                                            [--api-key-file FILE]]
    python -m lmforge_pipelines.rollout rollback POINTER [--namespace NS --deployment NAME [--api-key-file FILE]]

Each prints the pointer as it is then (JSON) on stdout, and its progress on stderr.
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmforge.common.cli import ServiceCli
from lmforge.common.errors import ConfigError, LmforgeError
from lmforge.model.package import fetch_package, verify_package
from lmforge.model.pointer import ModelPointer, point_to, read_pointer, rollback
from lmforge_pipelines import vllm_pods

CANARY_CONTAINER = "canary"
LOG_TAIL_LINES = 40
EXIT_CODES = """exit codes:
  0  done; the pointer is printed
  1  the rollout failed: the package does not verify, the replicas did not all serve it in time
     (vLLM: the restarted pods did not come up serving it), the canary failed, no previous
     package to roll back to, no pointer to show
  3  the pointer is not a model pointer (or not a local file or s3:// object)
  4  the pointer's store cannot be read or written"""


class RolloutFailed(LmforgeError):
    """The rollout did not happen or was undone (exit 1)."""


class PodsNotServing(RolloutFailed):
    """A restarted vLLM Deployment's new pods did not come up serving the package."""


class CanaryFailed(RuntimeError):
    pass


def _as_dict(obj: Any) -> dict:
    if isinstance(obj, dict):
        return obj
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(obj)


# ------------------------------------------------------------------------------ the package


def check_package(package: str) -> dict:
    """Download `package` and verify it as a replica will (file checksums required); its config."""
    work = tempfile.mkdtemp(prefix="lmforge-rollout-")
    try:
        return verify_package(fetch_package(package, work), require_checksums=True)
    except LmforgeError as exc:
        raise RolloutFailed(f"not rolling out {package}: {exc}") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------ the replicas


def served_package(url: str, timeout_s: float = 10.0) -> tuple[str | None, str]:
    """(the package the replica at `url` serves, or None; what it said) from its /readyz."""
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=timeout_s) as response:  # noqa: S310 - http(s) URLs
            body = json.loads(response.read())
        return body.get("package"), f"serves {body.get('package')}"
    except urllib.error.HTTPError as exc:
        try:
            reason = json.loads(exc.read()).get("reason", exc.reason)
        except ValueError:
            reason = exc.reason
        return None, f"not ready ({reason})"
    except (OSError, ValueError) as exc:
        return None, f"unreachable ({exc})"


def wait_until_served(package: str, replicas: Callable[[], list[str]], *, timeout_s: float, poll_s: float = 5.0,
                      clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                      log: Callable[[str], None] = print) -> list[str]:
    """Wait until there is a replica and every one `replicas()` lists serves `package`."""
    deadline = clock() + timeout_s
    while True:
        urls = replicas()
        behind = []
        for url in urls:
            served, said = served_package(url)
            if served != package:
                behind.append(f"{url} {said}")
        if urls and not behind:
            log(f"{len(urls)} replica(s) serve {package}")
            return urls
        why = "; ".join(behind) if urls else "no ready replica"
        if clock() >= deadline:
            raise RolloutFailed(f"the replicas did not all serve {package} within {timeout_s:g} s: {why}")
        sleep(poll_s)


# ------------------------------------------------------------------------------ Kubernetes


def canary_job(cronjob: dict, name: str, annotations: dict[str, str] | None = None) -> dict:
    """A Job from `cronjob`'s jobTemplate, owned by the CronJob, as `kubectl create job --from` makes it."""
    meta, template = cronjob["metadata"], cronjob["spec"]["jobTemplate"]
    template_meta = template.get("metadata") or {}
    owner = {"apiVersion": "batch/v1", "kind": "CronJob", "name": meta["name"], "uid": meta["uid"],
             "controller": True}
    annotations = {**(template_meta.get("annotations") or {}), "cronjob.kubernetes.io/instantiate": "manual",
                   **(annotations or {})}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": meta["namespace"], "annotations": annotations,
                         "labels": dict(template_meta.get("labels") or {}), "ownerReferences": [owner]},
            "spec": template["spec"]}


def job_outcome(job: dict) -> str | None:
    """"succeeded", "failed" or None (still running) from a Job's conditions."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") == "True":
            if condition.get("type") == "Complete":
                return "succeeded"
            if condition.get("type") == "Failed":
                return "failed"
    return None


def _pod_url(ip: str, port: int) -> str:
    return f"http://[{ip}]:{port}" if ":" in ip else f"http://{ip}:{port}"


def _ready(pod: dict) -> bool:
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    return (not pod["metadata"].get("deletionTimestamp") and bool(status.get("podIP"))
            and any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions))


class Cluster:
    """The inference Deployment's replicas and the canary CronJob in `namespace`, through the
    Kubernetes API (an AppsV1Api, CoreV1Api and BatchV1Api, or fakes). It writes one thing to the
    Deployment, and only to a vLLM one: the restart (follow)."""

    def __init__(self, namespace: str, deployment: str, *, apps=None, core=None, batch=None, container="inference",
                 api_key: str | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, log: Callable[[str], None] = print):
        if apps is None or core is None or batch is None:
            apps, core, batch = kubernetes_apis()
        self.namespace, self.deployment, self.container = namespace, deployment, container
        self.apps, self.core, self.batch = apps, core, batch
        self.api_key = api_key  # vLLM's /v1 key; None: the one in the Secret the pods mount, if any
        self.clock, self.sleep, self.log = clock, sleep, log

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.deployment}"

    def read_deployment(self) -> dict:
        return _as_dict(self.apps.read_namespaced_deployment(self.deployment, self.namespace))

    def _pods(self, deployment: dict) -> list[dict]:
        labels = deployment["spec"]["selector"]["matchLabels"]
        selector = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
        return _as_dict(self.core.list_namespaced_pod(self.namespace, label_selector=selector))["items"]

    def _port(self, deployment: dict) -> int:
        containers = deployment["spec"]["template"]["spec"]["containers"]
        container = next((c for c in containers if c["name"] == self.container), None)
        port = next((p["containerPort"] for p in (container or {}).get("ports") or [] if p.get("name") == "http"), None)
        if port is None:
            raise RolloutFailed(f"Deployment {self.where}: no container {self.container!r} with a port named http")
        return port

    def replica_urls(self) -> list[str]:
        """http://POD_IP:PORT of each ready pod of the Deployment (PORT: its container's `http` port)."""
        deployment = self.read_deployment()
        port = self._port(deployment)
        return [_pod_url(ip, port) for ip in sorted(pod["status"]["podIP"] for pod in self._pods(deployment)
                                                     if _ready(pod))]

    def follow(self, package: str, *, timeout_s: float, poll_s: float = 5.0) -> list[str]:
        """Bring the replicas onto what the pointer names (`package`) and return their URLs: wait
        until lmforge-serve's replicas report it; restart a vLLM Deployment (restart_onto)."""
        deployment = self.read_deployment()
        if vllm_pods.is_vllm(deployment):
            return self.restart_onto(package, deployment, timeout_s=timeout_s, poll_s=poll_s)
        return wait_until_served(package, self.replica_urls, timeout_s=timeout_s, poll_s=poll_s, clock=self.clock,
                                 sleep=self.sleep, log=self.log)

    # ---------------------------------------------------------------------------- vLLM

    def restart_onto(self, package: str, deployment: dict, *, timeout_s: float, poll_s: float = 5.0) -> list[str]:
        """Restart the vLLM Deployment and wait until every new pod fetched `package` and answers
        (vllm_pods.probe_replica); PodsNotServing (one line) when they do not within timeout_s."""
        model = vllm_pods.served_model_name(deployment, self.container)
        if model is None:
            raise PodsNotServing(f"Deployment {self.where}: container {self.container!r} has no --served-model-name")
        api_key = self._api_key(deployment)
        stamp = vllm_pods.restart_stamp()
        try:
            self.apps.patch_namespaced_deployment(self.deployment, self.namespace, vllm_pods.restart_patch(stamp))
        except Exception as exc:  # noqa: BLE001 - an ApiException (e.g. 403) or a connection error, said in one line
            raise PodsNotServing(f"cannot restart Deployment {self.where}: {_api_error(exc)}") from exc
        self.log(f"Deployment {self.where} restarted (restartedAt {stamp}): its new vLLM pods fetch what the pointer "
                 f"names, {package}")
        deadline = self.clock() + timeout_s
        pods = self._wait_rolled_out(stamp, package, deadline=deadline, timeout_s=timeout_s, poll_s=poll_s)
        urls = self._wait_answering(pods, model, api_key, deadline=deadline, timeout_s=timeout_s, poll_s=poll_s)
        self.log(f"{len(urls)} vLLM replica(s) serve {package}: /health 200, {model!r} listed, a completion answered")
        return urls

    def _api_key(self, deployment: dict) -> str | None:
        if self.api_key:
            return self.api_key
        secret = vllm_pods.api_key_secret(deployment)
        if secret is None:
            return None
        name, key = secret
        try:
            data = _as_dict(self.core.read_namespaced_secret(name, self.namespace)).get("data") or {}
            text = base64.b64decode(data[key]).decode()
        except Exception as exc:  # noqa: BLE001 - forbidden, missing Secret or key: said in one line
            raise PodsNotServing(f"cannot read the API key from Secret {self.namespace}/{name} (key {key}): "
                                 f"{_api_error(exc)}; give --api-key-file") from exc
        found = vllm_pods.first_key(text)
        if found is None:
            raise PodsNotServing(f"Secret {self.namespace}/{name} (key {key}) holds no API key")
        return found

    def _wait_rolled_out(self, stamp: str, package: str, *, deadline: float, timeout_s: float,
                         poll_s: float) -> list[dict]:
        """The new pods (those carrying `stamp`) once the rollout is complete and each is ready."""
        while True:
            deployment = self.read_deployment()
            stuck = vllm_pods.deadline_exceeded(deployment)
            if stuck:
                raise PodsNotServing(f"Deployment {self.where} did not roll out: {stuck}")
            pods = [pod for pod in self._pods(deployment) if not pod["metadata"].get("deletionTimestamp")]
            new = [pod for pod in pods
                   if (pod["metadata"].get("annotations") or {}).get(vllm_pods.RESTARTED_AT) == stamp]
            for pod in new:
                failure = vllm_pods.pod_failure(pod)
                if failure:
                    raise PodsNotServing(f"pod {pod['metadata']['name']} will not start: {failure}"
                                         f"{self._fetch_log_tail(pod)}")
            waits = vllm_pods.rollout_waits_for(deployment)
            ready = [pod for pod in new if _ready(pod)]
            if waits is None and ready and len(ready) == len(new):
                for pod in ready:
                    self._check_fetched(pod, package)
                return ready
            behind = [f"{pod['metadata']['name']} {vllm_pods.pod_waiting(pod)}" for pod in new if not _ready(pod)]
            why = "; ".join(filter(None, [waits, *behind])) or "no new pod yet"
            if self.clock() >= deadline:
                raise PodsNotServing(f"the restarted pods of {self.where} did not all come up within "
                                     f"{timeout_s:g} s: {why}")
            self.sleep(poll_s)

    def _fetch_log(self, pod: dict, tail_lines: int | None = None) -> str:
        return self.core.read_namespaced_pod_log(pod["metadata"]["name"], self.namespace,
                                                 container=vllm_pods.FETCH_CONTAINER, tail_lines=tail_lines)

    def _fetch_log_tail(self, pod: dict) -> str:
        try:
            lines = [line for line in self._fetch_log(pod, tail_lines=5).splitlines() if line.strip()]
        except Exception:  # noqa: BLE001 - the failure is what matters; the log is a courtesy
            return ""
        return f"; its log ends: {lines[-1][:300]}" if lines else ""

    def _check_fetched(self, pod: dict, package: str) -> None:
        try:
            fetched = vllm_pods.fetched_package(self._fetch_log(pod))
        except Exception as exc:  # noqa: BLE001 - unreadable log: the probes still run
            self.log(f"pod {pod['metadata']['name']}: its {vllm_pods.FETCH_CONTAINER} log is unreadable "
                     f"({_api_error(exc)}); not checking which package it fetched")
            return
        if fetched != package:
            raise PodsNotServing(f"pod {pod['metadata']['name']} fetched {fetched or 'no package'}, not {package} "
                                 f"(the pointer moved meanwhile?)")

    def _wait_answering(self, pods: list[dict], model: str, api_key: str | None, *, deadline: float,
                        timeout_s: float, poll_s: float) -> list[str]:
        port = self._port(self.read_deployment())
        pending = {_pod_url(pod["status"]["podIP"], port): pod["metadata"]["name"] for pod in pods}
        urls, said = sorted(pending), {}
        while pending:
            for url, name in list(pending.items()):
                probe = vllm_pods.probe_replica(url, model, api_key)
                if probe.ok:
                    del pending[url]
                elif probe.final:
                    raise PodsNotServing(f"pod {name} ({url}) does not serve {model!r}: {probe.said}")
                else:
                    said[url] = f"{name} {probe.said}"
            if not pending:
                break
            if self.clock() >= deadline:
                raise PodsNotServing(f"the restarted pods of {self.where} did not answer within {timeout_s:g} s: "
                                     + "; ".join(said[url] for url in pending))
            self.sleep(poll_s)
        return urls

    def run_canary(self, cronjob: str, *, package: str, timeout_s: float, poll_s: float = 10.0) -> str:
        """Run a Job from the canary CronJob now and wait for it; raises CanaryFailed (with the
        tail of its log) when it fails. Returns the Job's name."""
        source = _as_dict(self.batch.read_namespaced_cron_job(cronjob, self.namespace))
        name = f"{cronjob[:41]}-rollout-{int(time.time()):x}"
        body = canary_job(source, name, {"lmforge.io/model-package": package})
        self.batch.create_namespaced_job(self.namespace, body)
        self.log(f"canary Job {self.namespace}/{name} started (from CronJob {cronjob})")
        deadline = self.clock() + timeout_s
        while True:
            outcome = job_outcome(_as_dict(self.batch.read_namespaced_job(name, self.namespace)))
            if outcome == "succeeded":
                self.log(f"canary Job {name} passed")
                return name
            if outcome == "failed":
                raise CanaryFailed(f"canary Job {self.namespace}/{name} failed; its log ends:\n{self._log_tail(name)}")
            if self.clock() >= deadline:
                raise CanaryFailed(f"canary Job {self.namespace}/{name} did not finish in {timeout_s:g} s")
            self.sleep(poll_s)

    def _log_tail(self, job: str) -> str:
        pods = _as_dict(self.core.list_namespaced_pod(self.namespace, label_selector=f"job-name={job}"))["items"]
        if not pods:
            return "(no pod)"
        latest = max(pods, key=lambda pod: pod["metadata"].get("creationTimestamp") or "")
        try:
            return self.core.read_namespaced_pod_log(latest["metadata"]["name"], self.namespace,
                                                     container=CANARY_CONTAINER, tail_lines=LOG_TAIL_LINES)
        except Exception as exc:  # noqa: BLE001 - the failure is what matters; the log is a courtesy
            return f"(log unavailable: {exc})"


def _api_error(exc: BaseException) -> str:
    """An ApiException as `403 Forbidden: <the API server's message>`; anything else as it reads."""
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    if status is None:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    try:
        message = json.loads(getattr(exc, "body", None) or "{}").get("message", "")
    except (ValueError, AttributeError):
        message = ""
    return " ".join((f"{status} {reason}" + (f": {message}" if message else "")).split())


def kubernetes_apis():
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.AppsV1Api(), client.CoreV1Api(), client.BatchV1Api()


# ------------------------------------------------------------------------------ the rollout


Replicas = Cluster | Callable[[], list[str]]


def follower(replicas: Replicas, *, timeout_s: float, poll_s: float = 5.0,
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
             log: Callable[[str], None] = print) -> Callable[[str], object]:
    """How `replicas` come to serve a package: a Cluster (or its replica_urls, as the pipeline's
    rollout step passes it) decides by its Deployment (lmforge-serve's replicas follow the
    pointer; vLLM's are restarted); any other callable lists lmforge-serve replicas to wait for."""
    cluster = replicas if isinstance(replicas, Cluster) else getattr(replicas, "__self__", None)
    if isinstance(cluster, Cluster):
        return lambda package: cluster.follow(package, timeout_s=timeout_s, poll_s=poll_s)
    return lambda package: wait_until_served(package, replicas, timeout_s=timeout_s, poll_s=poll_s, clock=clock,
                                             sleep=sleep, log=log)


def _back_and_follow(pointer_uri: str, follow: Callable[[str], object], *, set_by: str, failed: str,
                     exc: BaseException, log: Callable[[str], None]) -> RolloutFailed:
    """Roll the pointer back after `failed` and bring the replicas onto the previous package; the
    RolloutFailed to raise, saying both."""
    back = rollback(pointer_uri, set_by=set_by)
    log(f"{failed}: {pointer_uri} rolled back to {back.model}")
    try:
        follow(back.model)
    except PodsNotServing as again:
        return RolloutFailed(f"{failed}; rolled back to {back.model}, whose pods did not come up either: {again} "
                             f"(first: {exc})")
    return RolloutFailed(f"{failed}; rolled back to {back.model}: {exc}")


def roll_out(pointer_uri: str, package: str, *, set_by: str, replicas: Replicas | None = None,
             canary: Callable[[], object] | None = None, rollback_on_canary_failure: bool = True,
             timeout_s: float = 1800.0, poll_s: float = 5.0, clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep, log: Callable[[str], None] = print) -> ModelPointer:
    """Verify `package`, point `pointer_uri` at it and, given `replicas`, bring them onto it
    (`follower`), then run `canary` (raising CanaryFailed on a failure). A failed canary, or vLLM
    pods that do not come up serving the package, roll the pointer back (and bring the replicas
    back) unless told not to; RolloutFailed either way."""
    meta = check_package(package)
    pointer = point_to(pointer_uri, package, set_by=set_by)
    was = pointer.previous[0].model if pointer.previous else "nothing"
    log(f"{pointer_uri} now names {package} (step {meta.get('step')}; it named {was})")
    if replicas is None:
        return pointer
    follow = follower(replicas, timeout_s=timeout_s, poll_s=poll_s, clock=clock, sleep=sleep, log=log)
    undo = rollback_on_canary_failure and bool(pointer.previous)
    why_kept = "no rollback asked" if pointer.previous else "nothing to roll back to"
    try:
        follow(package)
    except PodsNotServing as exc:
        failed = f"the new pods did not serve {package}"
        if not undo:
            raise RolloutFailed(f"{failed}, which stays rolled out ({why_kept}): {exc}") from exc
        raise _back_and_follow(pointer_uri, follow, set_by=f"{set_by} (pods did not serve it)", failed=failed,
                               exc=exc, log=log) from exc
    if canary is None:
        return pointer
    try:
        canary()
    except CanaryFailed as exc:
        failed = f"the canary failed on {package}"
        if not undo:
            raise RolloutFailed(f"{failed}, which stays rolled out ({why_kept}): {exc}") from exc
        raise _back_and_follow(pointer_uri, follow, set_by=f"{set_by} (canary failed)", failed=failed, exc=exc,
                               log=log) from exc
    log(f"the canary passed on {package}")
    return pointer


def roll_back(pointer_uri: str, *, set_by: str, replicas: Replicas | None = None,
              timeout_s: float = 1800.0, poll_s: float = 5.0, log: Callable[[str], None] = print) -> ModelPointer:
    """Point `pointer_uri` back at its previous package (verified first) and, given `replicas`,
    bring them onto it (`follower`: a vLLM Deployment restarts)."""
    current = read_pointer(pointer_uri)
    if current is None or not current.previous:
        raise RolloutFailed(f"{pointer_uri}: no previous model to roll back to")
    check_package(current.previous[0].model)
    back = rollback(pointer_uri, set_by=set_by)
    log(f"{pointer_uri} rolled back from {current.model} to {back.model}")
    if replicas is not None:
        follower(replicas, timeout_s=timeout_s, poll_s=poll_s, log=log)(back.model)
    return back


# ------------------------------------------------------------------------------ the command


def _progress(line: str) -> None:
    print(line, file=sys.stderr)


def _printed(pointer: ModelPointer) -> int:
    print(json.dumps(pointer.to_json(), indent=1))
    return 0


def _replicas(args: argparse.Namespace) -> Cluster | None:
    if not args.deployment:
        return None
    api_key = None
    if args.api_key_file:
        try:
            api_key = vllm_pods.first_key(Path(args.api_key_file).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--api-key-file {args.api_key_file}: cannot read: {exc}") from exc
        if api_key is None:
            raise ConfigError(f"--api-key-file {args.api_key_file}: holds no key")
    return Cluster(args.namespace, args.deployment, api_key=api_key, log=_progress)


def run_show(args: argparse.Namespace, _config: None) -> int:
    pointer = read_pointer(args.pointer)
    if pointer is None:
        raise RolloutFailed(f"{args.pointer}: no model pointer there")
    return _printed(pointer)


def run_set(args: argparse.Namespace, _config: None) -> int:
    cluster, timeout_s = _replicas(args), args.timeout_minutes * 60
    canary = None
    if cluster is not None and args.canary_cronjob:
        def canary():
            return cluster.run_canary(args.canary_cronjob, package=args.package, timeout_s=timeout_s)
    return _printed(roll_out(args.pointer, args.package, set_by=args.set_by, replicas=cluster, canary=canary,
                             timeout_s=timeout_s, log=_progress))


def run_rollback(args: argparse.Namespace, _config: None) -> int:
    return _printed(roll_back(args.pointer, set_by=args.set_by, replicas=_replicas(args),
                              timeout_s=args.timeout_minutes * 60, log=_progress))


def build_cli() -> ServiceCli:
    cli = ServiceCli("python -m lmforge_pipelines.rollout", name="rollout", service="pipelines", description=__doc__,
                     epilog=EXIT_CODES)
    show = cli.command("show", run_show, help="print the pointer")
    set_ = cli.command("set", run_set, help="verify a package and point the pointer at it")
    back = cli.command("rollback", run_rollback, help="point the pointer back at its previous package")
    for command in (show, set_, back):
        command.add_argument("pointer", help="the model pointer, e.g. s3://BUCKET/PREFIX/models/current")
    set_.add_argument("package", help="the model package, e.g. s3://BUCKET/PREFIX/models/VERSION")
    for command in (set_, back):
        command.add_argument("--namespace", default="lmforge", help="the inference Deployment's (default lmforge)")
        command.add_argument("--deployment", help="the inference Deployment (the chart's <release>-inference): "
                             "wait until its ready replicas serve the package (vLLM's: restart it first)")
        command.add_argument("--api-key-file", help="with a vLLM Deployment: the keys file whose first key the "
                             "checks of the new pods send (default: the API keys Secret the pods mount)")
        command.add_argument("--timeout-minutes", type=float, default=30.0)
        command.add_argument("--set-by", default="python -m lmforge_pipelines.rollout", help="recorded in the pointer")
    set_.add_argument("--canary-cronjob", help="with --deployment: run a Job from this CronJob once served")
    return cli


CLI = build_cli()
main = CLI.main


if __name__ == "__main__":
    sys.exit(main())
