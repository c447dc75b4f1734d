"""Launch a training run and wait for it: one small interface, one implementation per backend.

    launcher = make_launcher("trainjob", namespace="ml", values=release_values)  # Kubeflow Trainer v2
    launcher = make_launcher("pytorchjob", namespace="ml")                      # Training Operator v1
    launcher = make_launcher("local")                                            # torchrun on this machine
    result = launcher.run(job, timeout_s=72 * 3600)  # TrainingResult(run_uri, step); raises TrainingFailed

`KubernetesLauncher` renders the run's training job from the lmforge chart's own templates
(helm/lmforge/templates/trainer.yaml, trainjob.yaml: the one definition of the trainer pod) with
the release's values plus the run's settings, and submits it: a kubeflow.org/v1 PyTorchJob, or a
trainer.kubeflow.org/v1alpha1 TrainingRuntime and then the TrainJob that runs on it (and owns it).
It polls the job's status conditions until it succeeded or failed under an explicit deadline, and
on failure raises with the tail of the node-rank-0 trainer's log. The trainer container relies
only on torchrun's PET_* / RANK / LOCAL_RANK / WORLD_SIZE, which both operators provide.

`LocalTorchrunLauncher` runs the same trainer command with torchrun on this machine (kfp.local,
tests, laptops): RUN_DIR is CHECKPOINT_STORE/RUN and the checkpoints stay there.
"""

from __future__ import annotations

import collections
import copy
import os
import re
import signal
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUN_ANNOTATION = "lmforge.io/run"
MANIFEST = "MANIFEST.json"  # written last by the uploader: no manifest, no checkpoint (docs/design.md)
LOG_TAIL_LINES = 80
_DNS_LABEL = re.compile(r"[^a-z0-9-]+")


class TrainingFailed(RuntimeError):
    """The run failed; `log_tail` holds the last lines of the (node-rank-0) trainer's log."""

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
    """`pytorchjob` (Kubeflow Training Operator v1), `trainjob` (Kubeflow Trainer v2) or `local`
    (torchrun here); `kwargs` go to KubernetesLauncher.from_cluster or LocalTorchrunLauncher."""
    if kind in OPERATORS:
        return KubernetesLauncher.from_cluster(OPERATORS[kind], **kwargs)
    if kind == "local":
        return LocalTorchrunLauncher(**kwargs)
    raise ValueError(f"launcher {kind!r}: choose one of {sorted([*OPERATORS, 'local'])}")


# ----------------------------------------------------------------------------- Kubernetes

@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str


@dataclass(frozen=True)
class Operator:
    """What the launcher needs to know of one Kubeflow training operator."""

    name: str  # the chart's training.operator
    job: Resource  # runs the pods and reports the outcome in its status conditions
    prerequisites: tuple[Resource, ...]  # created before the job, and owned by it
    succeeded: str  # the condition type of success (Failed is failure for both)
    rank0_pods: str  # label selector of the node-rank-0 pod; {name} is the job's name
    trainer_container: str


PYTORCHJOB = Operator(
    name="pytorchjob", job=Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"), prerequisites=(),
    succeeded="Succeeded", rank0_pods="training.kubeflow.org/job-name={name},training.kubeflow.org/job-role=master",
    trainer_container="pytorch")
TRAINJOB = Operator(
    name="trainjob", job=Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"),
    prerequisites=(Resource("trainer.kubeflow.org", "v1alpha1", "trainingruntimes", "TrainingRuntime"),),
    succeeded="Complete",
    # The JobSet is named after the TrainJob; node rank 0 is completion index 0 of its node Job.
    rank0_pods="jobset.sigs.k8s.io/jobset-name={name},batch.kubernetes.io/job-completion-index=0",
    trainer_container="node")
OPERATORS = {operator.name: operator for operator in (PYTORCHJOB, TRAINJOB)}
# The run's own ConfigMaps (e.g. its evaluation Job template, training.evaluation): core API objects
# created before the job and owned by it, like the operator's prerequisites.
RUN_CONFIGMAP = Resource("", "v1", "configmaps", "ConfigMap")

# training.* values the launcher sets from the run; the rest come from the release's values.
LAUNCHER_VALUES = ("enabled", "operator", "run", "objectStore", "nodes", "nprocPerNode", "gpusPerProcess", "config")
MANAGED_BY = "lmforge-pipelines"


def chart_values(job: TrainingJob, operator: Operator, values: Mapping[str, Any] | None = None,
                 chart: Path | None = None) -> dict[str, Any]:
    """The release's chart `values` plus the run's training settings: what the chart renders the
    run's job from. training.config becomes exactly the run's trainer config."""
    from lmforge.common.config import cli_overrides
    from lmforge_pipelines.chart import chart_defaults

    merged = copy.deepcopy(dict(values or {}))
    training = dict(merged.get("training") or {})
    clash = sorted(set(training) & set(LAUNCHER_VALUES))
    if clash:
        raise ValueError(f"chart values training.{clash}: the launcher sets these from the run's parameters")
    defaults = chart_defaults(chart)["training"]["config"]
    merged["training"] = {**training, "enabled": True, "operator": operator.name, "run": job.run,
                          "objectStore": job.checkpoint_store, "nodes": job.nodes,
                          "nprocPerNode": job.nproc_per_node, "gpusPerProcess": job.gpus_per_process,
                          "config": _replacing(defaults, cli_overrides(job.overrides))}
    return merged


def _replacing(defaults: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """`new`, plus a null for every key of `defaults` it leaves out: Helm merges the values it is
    given over the chart's defaults and drops the keys set to null."""
    out = dict(new)
    for key, default in defaults.items():
        if key not in new:
            out[key] = None
        elif isinstance(default, Mapping) and isinstance(new[key], Mapping):
            out[key] = _replacing(default, new[key])
    return out


def training_objects(job: TrainingJob, operator: Operator, values: Mapping[str, Any] | None = None, *,
                     release: str = "lmforge", namespace: str = "lmforge", chart: Path | None = None) -> list[dict]:
    """The run's objects from the chart's training templates, in creation order: the run's
    ConfigMaps (any number), the operator's prerequisites, then the job. Helm's hook annotations
    are dropped (the launcher, not Helm, creates them), and they are labelled managed by
    lmforge-pipelines. A value the chart refuses raises helm_python's HelmValuesError /
    HelmRenderError with the chart's message."""
    from lmforge_pipelines.chart import render

    rendered = render(chart_values(job, operator, values, chart), release=release, namespace=namespace, chart=chart)
    def of_run(kind: str) -> list[dict]:
        return [o for o in rendered if o["kind"] == kind
                and (o["metadata"].get("annotations") or {}).get(RUN_ANNOTATION) == job.run]

    ours = of_run(RUN_CONFIGMAP.kind)
    for resource in (*operator.prerequisites, operator.job):
        found = of_run(resource.kind)
        if len(found) != 1:
            raise RuntimeError(f"the chart rendered {len(found)} {resource.kind} objects for run {job.run!r}, not 1")
        ours.append(found[0])
    objects = []
    for obj in ours:
        metadata = obj["metadata"]
        metadata["annotations"] = {k: v for k, v in metadata["annotations"].items() if not k.startswith("helm.sh/")}
        metadata["labels"]["app.kubernetes.io/managed-by"] = MANAGED_BY
        objects.append(obj)
    return objects


def terminal_condition(obj: dict, succeeded: str = PYTORCHJOB.succeeded) -> dict | None:
    """The job's success (`succeeded`) or Failed condition when it has ended, else None."""
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") in (succeeded, "Failed") and str(condition.get("status")) == "True":
            return condition
    return None


def _latest_condition(obj: dict) -> str:
    conditions = [c for c in (obj.get("status") or {}).get("conditions") or [] if str(c.get("status")) == "True"]
    return conditions[-1].get("type", "") if conditions else "Pending"


def _status_code(exc: BaseException) -> int | None:
    return getattr(exc, "status", None)


class KubernetesLauncher(TrainingLauncher):
    """A Kubeflow training operator: create the run's objects rendered from the chart, poll the
    job's conditions, read the node-rank-0 trainer's log on failure. `custom` is a
    CustomObjectsApi, `core` a CoreV1Api (or fakes); `values` the release's chart values."""

    def __init__(self, operator: Operator, custom, core, *, values: Mapping[str, Any] | None = None,
                 release: str = "lmforge", namespace: str = "lmforge", chart: Path | None = None,
                 poll_s: float = 15.0, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, log: Callable[[str], None] | None = None,
                 find_checkpoint: Callable[[str], int | None] | None = None):
        self.operator, self.custom, self.core = operator, custom, core
        self.values, self.release, self.namespace, self.chart = dict(values or {}), release, namespace, chart
        self.poll_s, self.clock, self.sleep = poll_s, clock, sleep
        self.log = log or (lambda line: print(line, flush=True))
        self.find_checkpoint = find_checkpoint or newest_remote_step

    @classmethod
    def from_cluster(cls, operator: Operator, **kwargs) -> KubernetesLauncher:
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return cls(operator, client.CustomObjectsApi(), client.CoreV1Api(), **kwargs)

    @property
    def kind(self) -> str:
        return self.operator.job.kind

    def objects(self, job: TrainingJob) -> list[dict]:
        return training_objects(job, self.operator, self.values, release=self.release, namespace=self.namespace,
                                chart=self.chart)

    def run(self, job: TrainingJob, *, timeout_s: float) -> TrainingResult:
        objects = self.objects(job)
        name = objects[-1]["metadata"]["name"]
        deadline = self.clock() + timeout_s
        self.launch(objects)
        try:
            self.wait(name, deadline)
        except TrainingTimeout:
            self.delete(objects)
            raise
        except (KeyboardInterrupt, SystemExit):  # the pipeline run was stopped: stop the job too
            self.delete(objects)
            raise
        step = self.find_checkpoint(job.run_uri)
        if step is None:
            raise TrainingFailed(f"{self.kind} {self.namespace}/{name} succeeded, but {job.run_uri}/checkpoints holds "
                                 f"no complete checkpoint ({MANIFEST})")
        return TrainingResult(job.run_uri, step)

    def resource(self, obj: dict) -> Resource:
        kinds = {r.kind: r for r in (RUN_CONFIGMAP, *self.operator.prerequisites, self.operator.job)}
        return kinds[obj["kind"]]

    def launch(self, objects: list[dict]) -> None:
        """Create the prerequisites, then the job; then make the job their owner, so that they go
        when it is deleted."""
        *prerequisites, body = objects
        for obj in prerequisites:
            self._create(self.resource(obj), obj)
        created = self._create(self.operator.job, body)
        owner = {"apiVersion": body["apiVersion"], "kind": body["kind"], "name": body["metadata"]["name"],
                 "uid": (created.get("metadata") or {}).get("uid")}
        for obj in prerequisites:
            resource = self.resource(obj)
            try:
                self._api(resource, "patch", obj["metadata"]["name"], {"metadata": {"ownerReferences": [owner]}})
            except Exception as exc:  # the run goes on; only the clean-up is left to whoever deletes the job
                self.log(f"could not make {body['kind']} {body['metadata']['name']} the owner of {resource.kind} "
                         f"{obj['metadata']['name']}: {exc}")

    def _create(self, resource: Resource, body: dict) -> dict:
        """Create `body`; when it exists already for the same run (a retried pipeline step), use
        that one; when it exists for another run, fail."""
        name = body["metadata"]["name"]
        try:
            created = self._api(resource, "create", body)
            self.log(f"created {resource.kind} {self.namespace}/{name}")
            return created
        except Exception as exc:
            if _status_code(exc) != 409:
                raise
            existing = self._api(resource, "get", name)
            existing = existing if isinstance(existing, dict) else existing.to_dict()
            run = ((existing.get("metadata") or {}).get("annotations") or {}).get(RUN_ANNOTATION)
            if run != body["metadata"]["annotations"][RUN_ANNOTATION]:
                raise TrainingFailed(f"{resource.kind} {self.namespace}/{name} already exists for another run "
                                     f"({run!r})") from exc
            self.log(f"{resource.kind} {self.namespace}/{name} already exists for this run: using it")
            return existing

    def _api(self, resource: Resource, verb: str, *args):
        """`verb` (create, get, patch, delete) on a custom resource, or on a ConfigMap through the core API."""
        if resource is RUN_CONFIGMAP:
            method = getattr(self.core, f"{verb}_namespaced_config_map")
            if verb == "create":
                return method(self.namespace, *args)
            return method(args[0], self.namespace, *args[1:])
        method = getattr(self.custom, f"{verb}_namespaced_custom_object")
        extra = {"propagation_policy": "Background"} if verb == "delete" else {}
        return method(resource.group, resource.version, self.namespace, resource.plural, *args, **extra)

    def wait(self, name: str, deadline: float) -> dict:
        """Poll until the job succeeded (returns it) or failed (raises with the log tail)."""
        job, namespace, what = self.operator.job, self.namespace, f"{self.kind} {self.namespace}/{name}"
        shown = None
        while True:
            try:
                obj = self.custom.get_namespaced_custom_object(job.group, job.version, namespace, job.plural, name)
            except Exception as exc:
                code = _status_code(exc)
                if code == 404:
                    raise TrainingFailed(f"{what} disappeared (deleted?)") from exc
                if code is not None and code < 500:
                    raise
                self.log(f"polling {what} failed ({exc}); retrying")  # an API server hiccup: keep polling
                obj = None
            if obj is not None:
                state = _latest_condition(obj)
                if state != shown:
                    self.log(f"{what}: {state}")
                    shown = state
                ended = terminal_condition(obj, self.operator.succeeded)
                if ended and ended["type"] == self.operator.succeeded:
                    return obj
                if ended:
                    why = f"{ended.get('reason', '')}: {ended.get('message', '')}".strip(": ")
                    raise TrainingFailed(f"{what} failed: {why or 'no reason given'}", self.rank0_log_tail(name))
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise TrainingTimeout(f"{what} did not finish in time (last state: {shown}); it has been deleted",
                                      self.rank0_log_tail(name))
            self.sleep(min(self.poll_s, remaining))

    def rank0_log_tail(self, name: str, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of the node-rank-0 pod's trainer container (its previous instance when
        the current one has no log yet), or a note saying why there are none."""
        try:
            pods = self.core.list_namespaced_pod(self.namespace,
                                                 label_selector=self.operator.rank0_pods.format(name=name))
            items = pods["items"] if isinstance(pods, dict) else pods.items
            if not items:
                return "(no node-rank-0 pod found)"
            pod = items[0]
            pod_name = pod["metadata"]["name"] if isinstance(pod, dict) else pod.metadata.name
            text = ""
            for previous in (False, True):
                try:
                    text = self.core.read_namespaced_pod_log(pod_name, self.namespace,
                                                             container=self.operator.trainer_container,
                                                             tail_lines=lines, previous=previous)
                except Exception:
                    if previous:
                        raise
                if text:
                    break
            return text.rstrip() or f"(pod {pod_name}: empty log)"
        except Exception as exc:
            return f"(could not read the node-rank-0 pod's log: {exc})"

    def delete(self, objects: list[dict]) -> None:
        """Delete the job, then its prerequisites (their owner reference may not have been set)."""
        for obj in reversed(objects):
            resource, name = self.resource(obj), obj["metadata"]["name"]
            try:
                self._api(resource, "delete", name)
                self.log(f"deleted {resource.kind} {self.namespace}/{name}")
            except Exception as exc:
                if _status_code(exc) != 404:
                    self.log(f"could not delete {resource.kind} {self.namespace}/{name}: {exc}")


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
        from lmforge.common.store import local_path_of, scheme_of

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
