"""How an evaluation job runs: a local process (the demo, the tests) or a Kubernetes Job.

Both take the job's arguments (`--package URI --step N --out URI`, appended to a command or to
a Job template's first container's args) and answer, when polled, whether the job is still
running, succeeded or failed. A job's name is deterministic (`<run>-eval-<step>`, a retry
`<run>-eval-<step>-retry`): a Kubernetes create answered 409 is a job this run already launched
(a sidecar restarted since), so it is followed, never started twice.

The Kubernetes runner speaks the batch/v1 API over stdlib urllib with the pod's service account
(token and CA in /var/run/secrets/kubernetes.io/serviceaccount): the uploader image needs no
Kubernetes client.
"""

from __future__ import annotations

import copy
import json
import os
import re
import ssl
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from lmforge.common.checkpoint_layout import step_name
from lmforge.common.errors import ConfigError, StorageError
from lmforge.common.logging import get_logger

log = get_logger("uploader")

SUCCEEDED, FAILED = "succeeded", "failed"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
LABEL_RUN, LABEL_STEP = "lmforge.io/run", "lmforge.io/step"
COMPONENT = "checkpoint-eval"


@dataclass(frozen=True)
class EvalJob:
    """One evaluation of one weights package (attempt 1, or 2 for the retry)."""

    run: str
    step: int
    package: str  # URI of the package in the store
    out: str  # URI the job writes its result to
    attempt: int = 1

    @property
    def args(self) -> list[str]:
        return ["--package", self.package, "--step", str(self.step), "--out", self.out]

    @property
    def name(self) -> str:
        return job_name(self.run, self.step, self.attempt)


def job_name(run: str, step: int, attempt: int = 1) -> str:
    """`<run>-eval-<step>` (`-retry` for attempt 2) as a DNS label: lower case, at most 63."""
    tail = f"-eval-{step}" + ("-retry" if attempt > 1 else "")
    return dns_label(run, 63 - len(tail)) + tail


def dns_label(text: str, length: int = 63) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:length].rstrip("-") or "run"


class Runner(Protocol):
    outlives_sidecar: bool  # its jobs run on once the sidecar exits (then it may launch while draining)

    def launch(self, job: EvalJob): ...  # a handle

    def outcome(self, handle) -> str | None: ...  # SUCCEEDED, FAILED, or None while running

    def cancel(self, handle) -> None: ...

    def close(self) -> None: ...  # the sidecar is exiting


@dataclass
class SubprocessRunner:
    """`command + job.args` as a child process; its output goes to `log_dir/step-N[-retry].log`."""

    outlives_sidecar = False  # close() stops the children

    command: list[str]
    log_dir: Path | None = None
    env: dict[str, str] | None = None
    _children: dict[str, subprocess.Popen] = field(default_factory=dict)

    def launch(self, job: EvalJob) -> str:
        output = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            output = open(self.log_dir / f"{step_name(job.step)}{'-retry' if job.attempt > 1 else ''}.log", "ab")  # noqa: SIM115
        try:
            # A session of its own: a stop signalled to the sidecar's process group (a pod's SIGTERM, the
            # demo's supervisor) leaves the job to finish within the drain; close() stops what is left.
            child = subprocess.Popen([*self.command, *job.args], stdout=output, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env={**os.environ, **(self.env or {})},
                                     start_new_session=True)
        finally:
            if output is not subprocess.DEVNULL:
                output.close()
        self._children[job.name] = child
        return job.name

    def outcome(self, handle: str) -> str | None:
        code = self._children[handle].poll()
        if code is None:
            return None
        self._children.pop(handle)
        if code != 0:
            log.warning("eval_job_exited", job=handle, exit_code=code)
        return SUCCEEDED if code == 0 else FAILED

    def cancel(self, handle: str) -> None:
        child = self._children.pop(handle, None)
        if child is not None and child.poll() is None:
            child.terminate()
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()

    def close(self) -> None:
        """Children still running are stopped: none outlives the sidecar (a later run reaches their
        steps again: `evals-finalize` ingests what is in the store)."""
        for handle in list(self._children):
            self.cancel(handle)


def job_outcome(job: dict) -> str | None:
    """SUCCEEDED, FAILED or None (still running) from a Job's conditions (as lmforge_pipelines.rollout)."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") == "True":
            if condition.get("type") == "Complete":
                return SUCCEEDED
            if condition.get("type") == "Failed":
                return FAILED
    return None


def pod_namespace(configured: str = "") -> str:
    if configured:
        return configured
    try:
        return (SERVICE_ACCOUNT / "namespace").read_text().strip()
    except OSError:
        pass
    if namespace := os.environ.get("LMFORGE_NAMESPACE", ""):
        return namespace
    raise ConfigError("evaluation.namespace is not set and this is not a pod (no service account namespace, "
                      "no LMFORGE_NAMESPACE)")


class KubernetesRunner:
    """Creates the evaluation Job from a template (the chart's ConfigMap, JSON), follows it by its
    conditions, deletes it on cancel. `api_url`, `token` and `ca_file` default to the pod's
    in-cluster API server and service account."""

    outlives_sidecar = True  # a Job runs on after the pod: one may still be launched while draining

    def __init__(self, job_template: str | Path, namespace: str = "", *, api_url: str | None = None,
                 token: str | None = None, ca_file: str | None = None, timeout: float = 30.0):
        try:
            self.template = json.loads(Path(job_template).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"evaluation.job_template {job_template}: not a readable JSON Job manifest ({exc})") \
                from exc
        containers = ((self.template.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers")
        if self.template.get("kind") != "Job" or not containers:
            raise ConfigError(f"evaluation.job_template {job_template}: not a Job with a container")
        self.namespace = pod_namespace(namespace)
        if api_url is None:
            host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise ConfigError("the kubernetes runner runs in a pod (KUBERNETES_SERVICE_HOST is not set)")
            api_url = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
            ca_file = ca_file or str(SERVICE_ACCOUNT / "ca.crt")
        self.api_url = api_url.rstrip("/")
        self._token, self._token_file = token, None if token is not None else SERVICE_ACCOUNT / "token"
        self._context = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self.timeout = timeout

    def manifest(self, job: EvalJob) -> dict:
        manifest = copy.deepcopy(self.template)
        labels = {"app.kubernetes.io/component": COMPONENT, LABEL_RUN: dns_label(job.run),
                  LABEL_STEP: str(job.step)}
        metadata = manifest.setdefault("metadata", {})
        metadata["name"] = job.name
        metadata.pop("generateName", None)
        metadata["namespace"] = self.namespace
        metadata["labels"] = {**(metadata.get("labels") or {}), **labels}
        pod = manifest["spec"]["template"]
        pod.setdefault("metadata", {})["labels"] = {**(pod["metadata"].get("labels") or {}), **labels}
        container = pod["spec"]["containers"][0]
        container["args"] = [*(container.get("args") or []), *job.args]
        return manifest

    def launch(self, job: EvalJob) -> str:
        status, _ = self._request("POST", self._jobs(), self.manifest(job), allow=(409,))
        if status == 409:
            log.info("eval_job_exists", job=job.name, action="following it (launched before a restart)")
        return job.name

    def outcome(self, handle: str) -> str | None:
        status, body = self._request("GET", f"{self._jobs()}/{handle}", allow=(404,))
        if status == 404:
            log.warning("eval_job_missing", job=handle, reason="deleted before it finished")
            return FAILED
        return job_outcome(body)

    def cancel(self, handle: str) -> None:
        self._request("DELETE", f"{self._jobs()}/{handle}", {"propagationPolicy": "Background"}, allow=(404,))

    def close(self) -> None:
        """Jobs outlive the sidecar: their results are ingested by a restarted one or `evals-finalize`."""

    def _jobs(self) -> str:
        return f"{self.api_url}/apis/batch/v1/namespaces/{self.namespace}/jobs"

    def _request(self, method: str, url: str, body: dict | None = None,
                 allow: tuple[int, ...] = ()) -> tuple[int, dict]:
        token = self._token if self._token is not None else self._token_file.read_text().strip()  # rotated: re-read
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, method=method, data=data,  # noqa: S310 - the API server's https URL
                                         headers={"Authorization": f"Bearer {token}", "Accept": "application/json",
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self._context) as response:  # noqa: S310
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if exc.code in allow:
                return exc.code, {}
            detail = exc.read()[:500].decode(errors="replace")
            raise StorageError(f"{method} {url}: HTTP {exc.code} {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise StorageError(f"{method} {url}: {exc}") from exc
