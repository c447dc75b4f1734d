"""Roll the inference service to a new model package: verify the package, point the model pointer
at it, wait until every serving replica reports it, run the canary against it, and roll back
(the pointer to its previous value) when the canary fails.

Why a pointer: the chart's inference Deployment names the pointer (`inference.model`, e.g.
s3://BUCKET/PREFIX/models/current), never a package, so `helm upgrade` renders the same `--model`
whatever was rolled out since, and the package served is decided by the pointer alone. The
replicas follow it and swap in place (lmforge.inference.model_swap): nothing restarts.

On Kubernetes (`Cluster`) the step only reads: the Deployment (its pod selector and port), its
ready pods (each one's /readyz says which package it serves), the canary CronJob; and creates
one Job from the CronJob's jobTemplate, as `kubectl create job --from=cronjob/…` does.

    python -m lmforge_pipelines.rollout show POINTER
    python -m lmforge_pipelines.rollout set POINTER PACKAGE [--namespace NS --deployment NAME [--canary-cronjob NAME]]
    python -m lmforge_pipelines.rollout rollback POINTER [--namespace NS --deployment NAME]

Each prints the pointer as it is then (JSON) on stdout, and its progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from lmforge.common.cli import ServiceCli
from lmforge.common.errors import LmforgeError
from lmforge.model.package import fetch_package, verify_package
from lmforge.model.pointer import ModelPointer, point_to, read_pointer, rollback

CANARY_CONTAINER = "canary"
LOG_TAIL_LINES = 40
EXIT_CODES = """exit codes:
  0  done; the pointer is printed
  1  the rollout failed: the package does not verify, the replicas did not all serve it in time,
     the canary failed, no previous package to roll back to, no pointer to show
  3  the pointer is not a model pointer (or not a local file or s3:// object)
  4  the pointer's store cannot be read or written"""


class RolloutFailed(LmforgeError):
    """The rollout did not happen or was undone (exit 1)."""


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


def _ready(pod: dict) -> bool:
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    return (not pod["metadata"].get("deletionTimestamp") and bool(status.get("podIP"))
            and any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions))


class Cluster:
    """The inference Deployment's replicas and the canary CronJob in `namespace`, through the
    Kubernetes API (an AppsV1Api, CoreV1Api and BatchV1Api, or fakes)."""

    def __init__(self, namespace: str, deployment: str, *, apps=None, core=None, batch=None, container="inference",
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 log: Callable[[str], None] = print):
        if apps is None or core is None or batch is None:
            apps, core, batch = kubernetes_apis()
        self.namespace, self.deployment, self.container = namespace, deployment, container
        self.apps, self.core, self.batch = apps, core, batch
        self.clock, self.sleep, self.log = clock, sleep, log

    def replica_urls(self) -> list[str]:
        """http://POD_IP:PORT of each ready pod of the Deployment (PORT: its container's `http` port)."""
        deployment = _as_dict(self.apps.read_namespaced_deployment(self.deployment, self.namespace))
        labels = deployment["spec"]["selector"]["matchLabels"]
        containers = deployment["spec"]["template"]["spec"]["containers"]
        container = next((c for c in containers if c["name"] == self.container), None)
        port = next((p["containerPort"] for p in (container or {}).get("ports") or [] if p.get("name") == "http"), None)
        if port is None:
            raise RolloutFailed(f"Deployment {self.namespace}/{self.deployment}: no container {self.container!r} "
                                f"with a port named http")
        selector = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
        pods = _as_dict(self.core.list_namespaced_pod(self.namespace, label_selector=selector))["items"]
        hosts = [pod["status"]["podIP"] for pod in pods if _ready(pod)]
        return [f"http://[{ip}]:{port}" if ":" in ip else f"http://{ip}:{port}" for ip in sorted(hosts)]

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


def kubernetes_apis():
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.AppsV1Api(), client.CoreV1Api(), client.BatchV1Api()


# ------------------------------------------------------------------------------ the rollout


def roll_out(pointer_uri: str, package: str, *, set_by: str, replicas: Callable[[], list[str]] | None = None,
             canary: Callable[[], object] | None = None, rollback_on_canary_failure: bool = True,
             timeout_s: float = 1800.0, poll_s: float = 5.0, clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep, log: Callable[[str], None] = print) -> ModelPointer:
    """Verify `package`, point `pointer_uri` at it and, given `replicas`, wait until they all serve
    it, then run `canary` (raising CanaryFailed on a failure). A failed canary rolls the pointer
    back (and waits for the replicas again) unless told not to; RolloutFailed either way."""
    meta = check_package(package)
    pointer = point_to(pointer_uri, package, set_by=set_by)
    was = pointer.previous[0].model if pointer.previous else "nothing"
    log(f"{pointer_uri} now names {package} (step {meta.get('step')}; it named {was})")
    if replicas is None:
        return pointer
    wait = dict(timeout_s=timeout_s, poll_s=poll_s, clock=clock, sleep=sleep, log=log)
    wait_until_served(package, replicas, **wait)
    if canary is None:
        return pointer
    try:
        canary()
    except CanaryFailed as exc:
        if not rollback_on_canary_failure or not pointer.previous:
            why = "no rollback asked" if pointer.previous else "nothing to roll back to"
            raise RolloutFailed(f"the canary failed on {package}, which stays rolled out ({why}): {exc}") from exc
        back = rollback(pointer_uri, set_by=f"{set_by} (canary failed)")
        log(f"the canary failed on {package}: {pointer_uri} rolled back to {back.model}")
        wait_until_served(back.model, replicas, **wait)
        raise RolloutFailed(f"the canary failed on {package}; rolled back to {back.model}: {exc}") from exc
    log(f"the canary passed on {package}")
    return pointer


def roll_back(pointer_uri: str, *, set_by: str, replicas: Callable[[], list[str]] | None = None,
              timeout_s: float = 1800.0, poll_s: float = 5.0, log: Callable[[str], None] = print) -> ModelPointer:
    """Point `pointer_uri` back at its previous package (verified first) and, given `replicas`,
    wait until they serve it."""
    current = read_pointer(pointer_uri)
    if current is None or not current.previous:
        raise RolloutFailed(f"{pointer_uri}: no previous model to roll back to")
    check_package(current.previous[0].model)
    back = rollback(pointer_uri, set_by=set_by)
    log(f"{pointer_uri} rolled back from {current.model} to {back.model}")
    if replicas is not None:
        wait_until_served(back.model, replicas, timeout_s=timeout_s, poll_s=poll_s, log=log)
    return back


# ------------------------------------------------------------------------------ the command


def _progress(line: str) -> None:
    print(line, file=sys.stderr)


def _printed(pointer: ModelPointer) -> int:
    print(json.dumps(pointer.to_json(), indent=1))
    return 0


def _replicas(args: argparse.Namespace) -> Cluster | None:
    return Cluster(args.namespace, args.deployment) if args.deployment else None


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
    return _printed(roll_out(args.pointer, args.package, set_by=args.set_by,
                             replicas=cluster.replica_urls if cluster else None, canary=canary, timeout_s=timeout_s,
                             log=_progress))


def run_rollback(args: argparse.Namespace, _config: None) -> int:
    cluster = _replicas(args)
    return _printed(roll_back(args.pointer, set_by=args.set_by, replicas=cluster.replica_urls if cluster else None,
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
                             "wait until its ready replicas serve the package")
        command.add_argument("--timeout-minutes", type=float, default=30.0)
        command.add_argument("--set-by", default="python -m lmforge_pipelines.rollout", help="recorded in the pointer")
    set_.add_argument("--canary-cronjob", help="with --deployment: run a Job from this CronJob once served")
    return cli


CLI = build_cli()
main = CLI.main


if __name__ == "__main__":
    sys.exit(main())
