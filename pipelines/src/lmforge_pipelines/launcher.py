"""Launch a training run and wait for it: one small interface, one implementation per backend.

    launcher = make_launcher("pytorchjob", pod=PodSettings(namespace="ml"))  # Kubeflow Training v1
    launcher = make_launcher("local")                                        # torchrun on this machine
    result = launcher.run(job, timeout_s=72 * 3600)  # TrainingResult(run_uri, step); raises TrainingFailed

`PyTorchJobLauncher` creates a kubeflow.org/v1 PyTorchJob shaped like the chart's
(helm/lmforge/templates/trainer.yaml: a Master plus nodes-1 Workers, container `pytorch` running
torchrun from the operator's PET_* variables, the restore init container and the checkpoint
uploader sidecar), polls its status conditions until Succeeded or Failed under an explicit
deadline, and on failure raises with the tail of the Master pod's log. A Kubeflow Trainer v2
(TrainJob) launcher fits behind the same `run()`: the trainer container relies only on torchrun's
PET_* / RANK / LOCAL_RANK / WORLD_SIZE, never on the operator's node-level variables.

`LocalTorchrunLauncher` runs the same trainer command with torchrun on this machine (kfp.local,
tests, laptops): RUN_DIR is CHECKPOINT_STORE/RUN and the checkpoints stay there.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge_pipelines.images import image

GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"
RUN_ANNOTATION = "lmforge.io/run"
MANIFEST = "MANIFEST.json"  # written last by the uploader: no manifest, no checkpoint (docs/design.md)
LOG_TAIL_LINES = 80
_DNS_LABEL = re.compile(r"[^a-z0-9-]+")


class TrainingFailed(RuntimeError):
    """The run failed; `log_tail` holds the last lines of the (Master) trainer's log."""

    def __init__(self, message: str, log_tail: str = ""):
        self.log_tail = log_tail
        super().__init__(f"{message}\n--- last lines of the trainer's log ---\n{log_tail}" if log_tail else message)


class TrainingTimeout(TrainingFailed):
    """The run did not finish before the deadline (it has been stopped)."""


@dataclass(kw_only=True)
class TrainingJob:
    """What to train, independent of where."""

    run: str  # run name: RUN_DIR is <checkpoint_store>/<run> locally, /checkpoints/<run> in a pod
    overrides: list[str]  # trainer config as key=value (run_dir, data.cache_dir, metrics.port, device: the launcher's)
    checkpoint_store: str  # prefix of runs: s3://BUCKET/PREFIX on Kubernetes, a local directory locally
    nodes: int = 1
    nproc_per_node: int = 1  # torchrun processes per node: the GPUs per node, or CPU processes
    gpus_per_process: int = 0  # 1: each process trains on its own GPU; 0: CPU

    def __post_init__(self):
        if not self.run or not _DNS_LABEL.sub("", self.run.lower()):
            raise ValueError(f"run name {self.run!r}: use letters, digits and dashes")
        if "/" in self.run:
            raise ValueError(f"run name {self.run!r} must not contain '/'")
        for name in ("nodes", "nproc_per_node"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.gpus_per_process not in (0, 1):
            raise ValueError(f"gpus_per_process must be 0 or 1, got {self.gpus_per_process}")
        for pair in self.overrides:
            if "=" not in pair:
                raise ValueError(f"trainer override {pair!r} is not KEY=VALUE")

    @property
    def run_uri(self) -> str:
        return f"{self.checkpoint_store.rstrip('/')}/{self.run}"


@dataclass(frozen=True)
class TrainingResult:
    run_uri: str  # the run's checkpoints are under <run_uri>/checkpoints/step-NNNNNNNN
    step: int  # the newest complete checkpoint


class TrainingLauncher(ABC):
    """Start a training run, wait until it ends, return where its final checkpoint is."""

    @abstractmethod
    def run(self, job: TrainingJob, *, timeout_s: float) -> TrainingResult:
        """Blocks until the run ends. Raises TrainingFailed (with the log tail) when it fails,
        TrainingTimeout after `timeout_s` seconds (required: there is no silent default)."""


def make_launcher(kind: str, **kwargs) -> TrainingLauncher:
    """`pytorchjob` (Kubeflow Training Operator v1) or `local` (torchrun here)."""
    kinds: dict[str, Callable[..., TrainingLauncher]] = {
        "pytorchjob": PyTorchJobLauncher.from_cluster, "local": LocalTorchrunLauncher}
    if kind not in kinds:
        raise ValueError(f"launcher {kind!r}: choose one of {sorted(kinds)}")
    return kinds[kind](**kwargs)


# ----------------------------------------------------------------------------- Kubernetes (v1)

@dataclass(kw_only=True)
class PodSettings:
    """What the chart's values decide about the trainer pods (the defaults are the chart's)."""

    namespace: str = "lmforge"
    release: str = "lmforge"  # labels, and the default service account <release>-workloads
    image: str = field(default_factory=lambda: image("trainer"))
    uploader_image: str = field(default_factory=lambda: image("uploader"))
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: list[str] = field(default_factory=list)
    service_account: str = ""  # "" = <release>-workloads
    log_level: str = "INFO"
    s3_endpoint_url: str = ""
    s3_region: str = ""
    s3_credentials_secret: str = ""
    s3_access_key_id_key: str = "AWS_ACCESS_KEY_ID"
    s3_secret_access_key_key: str = "AWS_SECRET_ACCESS_KEY"  # noqa: S105 - a key name in the Secret
    checkpoint_pvc: str = ""  # a ReadWriteMany claim at /checkpoints (required when nodes > 1)
    gpu_resource: str = "nvidia.com/gpu"
    port: int = 23456
    metrics_port: int = 9402
    uploader_metrics_port: int = 9401
    uploader_grace_seconds: int = 300
    restart_policy: str = "OnFailure"
    backoff_limit: int = 3
    resources: dict = field(default_factory=lambda: {"requests": {"cpu": "2", "memory": "8Gi"},
                                                     "limits": {"cpu": "4", "memory": "16Gi"}})
    uploader_resources: dict = field(default_factory=lambda: {"requests": {"cpu": "500m", "memory": "512Mi"},
                                                              "limits": {"cpu": "2", "memory": "2Gi"}})
    checkpoints_size_limit: str = "100Gi"
    data_cache_size_limit: str = "200Gi"
    shm_size: str = "8Gi"
    tmp_size_limit: str = "10Gi"
    node_selector: dict = field(default_factory=dict)
    tolerations: list = field(default_factory=list)
    run_as_user: int = 10001

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PodSettings:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown Kubernetes setting(s) {unknown}; known: {sorted(known)}")
        return cls(**values)


def job_name(settings: PodSettings, run: str) -> str:
    """<release>-train-<run> as a DNS label, cut to 50 characters (the operator appends
    -worker-<index> to pod and Service names, which must stay within 63)."""
    name = _DNS_LABEL.sub("-", f"{settings.release}-train-{run}".lower()).strip("-")
    return name[:50].rstrip("-")


def _env(s: PodSettings) -> list[dict]:
    env = [{"name": "LMFORGE_LOG_LEVEL", "value": s.log_level}]
    if s.s3_endpoint_url:
        env.append({"name": "AWS_ENDPOINT_URL", "value": s.s3_endpoint_url})
    if s.s3_region:
        env.append({"name": "AWS_DEFAULT_REGION", "value": s.s3_region})
    if s.s3_credentials_secret:
        for name, key in (("AWS_ACCESS_KEY_ID", s.s3_access_key_id_key),
                          ("AWS_SECRET_ACCESS_KEY", s.s3_secret_access_key_key)):
            env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": s.s3_credentials_secret, "key": key}}})
    return env


def _container_security() -> dict:
    return {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}}


def _labels(s: PodSettings, run: str) -> dict:
    return {"app.kubernetes.io/name": "lmforge", "app.kubernetes.io/instance": s.release,
            "app.kubernetes.io/component": "trainer", "app.kubernetes.io/managed-by": "lmforge-pipelines",
            "lmforge.io/run": _DNS_LABEL.sub("-", run.lower())[:63].strip("-")}


def _pod_template(job: TrainingJob, s: PodSettings, role: str) -> dict:
    """The chart's lmforge.trainerPod, from parameters."""
    checkpoint_dir = f"/checkpoints/{job.run}/checkpoints"
    store = job.run_uri
    gpus = job.gpus_per_process * job.nproc_per_node
    uploader = not s.checkpoint_pvc or role == "master"  # on a shared claim the Master alone uploads
    mounts = [{"name": "checkpoints", "mountPath": "/checkpoints"}, {"name": "tmp", "mountPath": "/tmp"}]
    init_containers = []
    if uploader:
        common = {"image": s.uploader_image, "imagePullPolicy": s.image_pull_policy, "command": ["lmforge-uploader"],
                  "env": _env(s), "resources": s.uploader_resources, "securityContext": _container_security(),
                  "volumeMounts": mounts}
        init_containers = [
            {"name": "restore", **common, "args": ["restore", "--src", store, "--dir", checkpoint_dir]},
            {"name": "uploader", **common, "restartPolicy": "Always",
             "args": ["watch", "--dir", checkpoint_dir, "--dest", store, "--set",
                      f"metrics_port={s.uploader_metrics_port}", "--set", f"grace_seconds={s.uploader_grace_seconds}"],
             "ports": [{"name": "uploader-metrics", "containerPort": s.uploader_metrics_port, "protocol": "TCP"}],
             # the sidecar's lease in the store is named after its pod (uploader/lease.py)
             "env": [*_env(s), {"name": "LMFORGE_UPLOADER__IDENTITY",
                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
        ]
    resources = json.loads(json.dumps(s.resources))
    if gpus:
        for kind in ("limits", "requests"):
            resources.setdefault(kind, {})[s.gpu_resource] = str(gpus)
    trainer = {
        "name": "pytorch",  # Kubeflow v1 finds the training container by this name
        "image": s.image,
        "imagePullPolicy": s.image_pull_policy,
        "command": ["python", "-m", "torch.distributed.run"],
        "args": ["-m", "lmforge.trainer", *job.overrides, f"run_dir=/checkpoints/{job.run}",
                 "data.cache_dir=/cache/data", f"metrics.port={s.metrics_port}",
                 f"device={'cuda' if gpus else 'cpu'}", "checkpoint.purge_requires_upload=true"],
        "ports": [{"name": "pytorchjob-port", "containerPort": s.port, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": s.metrics_port, "protocol": "TCP"}],
        "env": [*_env(s), {"name": "HOME", "value": "/tmp"}],
        "resources": resources,
        "securityContext": _container_security(),
        "volumeMounts": [{"name": "checkpoints", "mountPath": "/checkpoints"}, {"name": "cache", "mountPath": "/cache"},
                         {"name": "shm", "mountPath": "/dev/shm"}, {"name": "tmp", "mountPath": "/tmp"}],
    }
    checkpoints = ({"persistentVolumeClaim": {"claimName": s.checkpoint_pvc}} if s.checkpoint_pvc
                   else {"emptyDir": {"sizeLimit": s.checkpoints_size_limit}})
    spec: dict[str, Any] = {
        "serviceAccountName": s.service_account or f"{s.release}-workloads",
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": s.run_as_user, "runAsGroup": s.run_as_user,
                            "fsGroup": s.run_as_user, "seccompProfile": {"type": "RuntimeDefault"}},
    }
    if s.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in s.image_pull_secrets]
    if s.node_selector:
        spec["nodeSelector"] = s.node_selector
    if s.tolerations:
        spec["tolerations"] = s.tolerations
    spec["terminationGracePeriodSeconds"] = s.uploader_grace_seconds + 30
    if init_containers:
        spec["initContainers"] = init_containers
    spec["containers"] = [trainer]
    spec["volumes"] = [
        {"name": "checkpoints", **checkpoints},
        {"name": "cache", "emptyDir": {"sizeLimit": s.data_cache_size_limit}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": s.shm_size}},
        {"name": "tmp", "emptyDir": {"sizeLimit": s.tmp_size_limit}},
    ]
    labels = _labels(s, job.run)
    if role == "master":
        labels["training.kubeflow.org/job-role"] = "master"
    return {"metadata": {"labels": labels}, "spec": spec}


def pytorchjob_manifest(job: TrainingJob, settings: PodSettings) -> dict:
    """The kubeflow.org/v1 PyTorchJob for `job`, in the shape of the chart's trainer.yaml."""
    if job.nodes > 1 and not settings.checkpoint_pvc:
        raise ValueError(f"nodes is {job.nodes}: a multi-node run needs a ReadWriteMany checkpoint_pvc, because "
                         "every rank writes its checkpoint shards into one shared directory")
    if not job.checkpoint_store.startswith("s3://"):
        raise ValueError(f"checkpoint_store {job.checkpoint_store!r}: the pods upload checkpoints to an s3:// prefix")
    replicas: dict[str, Any] = {"Master": {"replicas": 1, "restartPolicy": settings.restart_policy,
                                           "template": _pod_template(job, settings, "master")}}
    if job.nodes > 1:
        replicas["Worker"] = {"replicas": job.nodes - 1, "restartPolicy": settings.restart_policy,
                              "template": _pod_template(job, settings, "worker")}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": job_name(settings, job.run), "namespace": settings.namespace,
                     "labels": _labels(settings, job.run), "annotations": {RUN_ANNOTATION: job.run}},
        "spec": {
            "nprocPerNode": str(job.nproc_per_node),
            "runPolicy": {"backoffLimit": settings.backoff_limit, "cleanPodPolicy": "Running"},
            "pytorchReplicaSpecs": replicas,
        },
    }


def terminal_condition(obj: dict) -> dict | None:
    """The job's Succeeded or Failed condition when it has ended, else None."""
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Succeeded", "Failed") and str(condition.get("status")) == "True":
            return condition
    return None


def _latest_condition(obj: dict) -> str:
    conditions = [c for c in (obj.get("status") or {}).get("conditions") or [] if str(c.get("status")) == "True"]
    return conditions[-1].get("type", "") if conditions else "Pending"


def _status_code(exc: BaseException) -> int | None:
    return getattr(exc, "status", None)


class PyTorchJobLauncher(TrainingLauncher):
    """Kubeflow Training Operator v1: create the PyTorchJob, poll its conditions, read the
    Master's log on failure. `custom` is a CustomObjectsApi, `core` a CoreV1Api (or fakes)."""

    def __init__(self, custom, core, pod: PodSettings | None = None, *, poll_s: float = 15.0,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 log: Callable[[str], None] | None = None, find_checkpoint: Callable[[str], int | None] | None = None):
        self.custom, self.core = custom, core
        self.pod = pod or PodSettings()
        self.poll_s, self.clock, self.sleep = poll_s, clock, sleep
        self.log = log or (lambda line: print(line, flush=True))
        self.find_checkpoint = find_checkpoint or newest_remote_step

    @classmethod
    def from_cluster(cls, pod: PodSettings | None = None, **kwargs) -> PyTorchJobLauncher:
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return cls(client.CustomObjectsApi(), client.CoreV1Api(), pod, **kwargs)

    def run(self, job: TrainingJob, *, timeout_s: float) -> TrainingResult:
        body = pytorchjob_manifest(job, self.pod)
        name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
        deadline = self.clock() + timeout_s
        self.launch(body)
        try:
            self.wait(name, namespace, deadline)
        except TrainingTimeout:
            self.delete(name, namespace)
            raise
        except (KeyboardInterrupt, SystemExit):  # the pipeline run was stopped: stop the job too
            self.delete(name, namespace)
            raise
        step = self.find_checkpoint(job.run_uri)
        if step is None:
            raise TrainingFailed(f"PyTorchJob {namespace}/{name} succeeded, but {job.run_uri}/checkpoints holds no "
                                 f"complete checkpoint ({MANIFEST})")
        return TrainingResult(job.run_uri, step)

    def launch(self, body: dict) -> None:
        name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
        try:
            self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
            self.log(f"created PyTorchJob {namespace}/{name}")
        except Exception as exc:
            if _status_code(exc) != 409:
                raise
            # A retried pipeline step finds its own job: wait for it instead of starting another.
            existing = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            run = ((existing.get("metadata") or {}).get("annotations") or {}).get(RUN_ANNOTATION)
            if run != body["metadata"]["annotations"][RUN_ANNOTATION]:
                raise TrainingFailed(f"PyTorchJob {namespace}/{name} already exists for another run ({run!r})") from exc
            self.log(f"PyTorchJob {namespace}/{name} already exists for this run: waiting for it")

    def wait(self, name: str, namespace: str, deadline: float) -> dict:
        """Poll until Succeeded (returns the object) or Failed (raises with the log tail)."""
        shown, api_errors = None, 0
        while True:
            try:
                obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
                api_errors = 0
            except Exception as exc:
                code = _status_code(exc)
                if code == 404:
                    raise TrainingFailed(f"PyTorchJob {namespace}/{name} disappeared (deleted?)") from exc
                if code is not None and code < 500:
                    raise
                api_errors += 1  # an API server hiccup: keep polling until the deadline
                self.log(f"polling PyTorchJob {namespace}/{name} failed ({exc}); retrying")
                obj = None
            if obj is not None:
                state = _latest_condition(obj)
                if state != shown:
                    self.log(f"PyTorchJob {namespace}/{name}: {state}")
                    shown = state
                ended = terminal_condition(obj)
                if ended and ended["type"] == "Succeeded":
                    return obj
                if ended:
                    why = f"{ended.get('reason', '')}: {ended.get('message', '')}".strip(": ")
                    raise TrainingFailed(f"PyTorchJob {namespace}/{name} failed: {why or 'no reason given'}",
                                         self.master_log_tail(name, namespace))
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise TrainingTimeout(f"PyTorchJob {namespace}/{name} did not finish in time (last state: {shown}); "
                                      "it has been deleted", self.master_log_tail(name, namespace))
            self.sleep(min(self.poll_s, remaining))

    def master_log_tail(self, name: str, namespace: str, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of the Master pod's `pytorch` container (its previous instance when
        the current one has no log yet), or a note saying why there are none."""
        try:
            selector = f"training.kubeflow.org/job-name={name},training.kubeflow.org/job-role=master"
            pods = self.core.list_namespaced_pod(namespace, label_selector=selector)
            items = pods["items"] if isinstance(pods, dict) else pods.items
            if not items:
                return "(no Master pod found)"
            pod = items[0]
            pod_name = pod["metadata"]["name"] if isinstance(pod, dict) else pod.metadata.name
            text = ""
            for previous in (False, True):
                try:
                    text = self.core.read_namespaced_pod_log(pod_name, namespace, container="pytorch",
                                                             tail_lines=lines, previous=previous)
                except Exception:
                    if previous:
                        raise
                if text:
                    break
            return text.rstrip() or f"(pod {pod_name}: empty log)"
        except Exception as exc:
            return f"(could not read the Master pod's log: {exc})"

    def delete(self, name: str, namespace: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                        propagation_policy="Background")
            self.log(f"deleted PyTorchJob {namespace}/{name}")
        except Exception as exc:
            self.log(f"could not delete PyTorchJob {namespace}/{name}: {exc}")


def newest_remote_step(run_uri: str) -> int | None:
    """The newest step under <run_uri>/checkpoints/ whose MANIFEST.json the uploader wrote."""
    from lmforge.common.checkpoint_layout import parse_step
    from lmforge.common.storage import open_store

    steps = []
    for rel in open_store(run_uri).list("checkpoints/"):
        parts = rel.split("/")
        if len(parts) == 3 and parts[2] == MANIFEST and (step := parse_step(parts[1])) is not None:
            steps.append(step)
    return max(steps, default=None)


# ----------------------------------------------------------------------------- local torchrun

class LocalTorchrunLauncher(TrainingLauncher):
    """torchrun --standalone on this machine with nodes × nproc_per_node processes (one
    "node": the world size is what the cluster run would have). Output goes to stdout and to
    RUN_DIR/launcher.log."""

    def __init__(self, *, python: str | None = None, env: dict[str, str] | None = None,
                 log: Callable[[str], None] | None = None):
        self.python = python or sys.executable
        self.env = env or {}
        self.log = log or (lambda line: print(line, end="" if line.endswith("\n") else "\n", flush=True))

    def command(self, job: TrainingJob, run_dir: Path) -> list[str]:
        nproc = job.nodes * job.nproc_per_node
        return [self.python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                "-m", "lmforge.trainer", *job.overrides, f"run_dir={run_dir}"]

    def run(self, job: TrainingJob, *, timeout_s: float) -> TrainingResult:
        from lmforge.common.checkpoint_layout import step_dirs
        from lmforge.common.storage import local_path_of, scheme_of

        if scheme_of(job.checkpoint_store) not in ("", "file"):
            raise ValueError(f"checkpoint_store {job.checkpoint_store!r}: the local launcher keeps checkpoints in a "
                             "local directory")
        run_dir = local_path_of(job.run_uri)
        run_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **self.env}
        if job.gpus_per_process == 0:
            env.setdefault("CUDA_VISIBLE_DEVICES", "")
        tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        command = self.command(job, run_dir)
        self.log(f"running {' '.join(command)}")
        with open(run_dir / "launcher.log", "a", encoding="utf-8") as log_file:
            log_file.write(f"$ {' '.join(command)}\n")
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       env=env, start_new_session=True)

            def pump():
                for line in process.stdout:
                    log_file.write(line)
                    tail.append(line.rstrip("\n"))
                    self.log(line)

            reader = threading.Thread(target=pump, daemon=True)
            reader.start()
            try:
                code = process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._stop(process)
                reader.join(timeout=10)
                raise TrainingTimeout(f"torchrun did not finish in {timeout_s:g} s; it has been stopped",
                                      "\n".join(tail)) from None
            except BaseException:
                self._stop(process)
                raise
            reader.join(timeout=10)
        if code != 0:
            raise TrainingFailed(f"torchrun exited with status {code} (run_dir {run_dir})", "\n".join(tail))
        steps = step_dirs(run_dir / "checkpoints", committed=True)
        if not steps:
            raise TrainingFailed(f"training finished but {run_dir}/checkpoints holds no committed checkpoint",
                                 "\n".join(tail))
        return TrainingResult(str(run_dir), steps[-1])

    @staticmethod
    def _stop(process: subprocess.Popen) -> None:
        """SIGTERM to torchrun's process group (it forwards to the ranks), SIGKILL if it lingers."""
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue
