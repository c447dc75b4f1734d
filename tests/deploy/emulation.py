"""What a cluster does with the chart's objects, done on one machine (docs/design.md "Real components":
the training operator's stand-in is "the rendered PyTorchJob's container commands run as local
processes with the env the operator injects").

A pod is a directory; a container is a process started from the container's own `command` and
`args` ($(VAR) references expanded), with the container's declared `env` (Secret and field
references resolved, the pod's annotations included) plus what the controller injects: the
Kubeflow Training Operator v1's variables (`operator_env`) into a PyTorchJob's containers,
Kubeflow Trainer v2's (`trainer_env`) into a TrainJob's `node` container, JOB_COMPLETION_INDEX
(and the completion-index annotation) into an Indexed Job's. Init containers run in order to
completion, native sidecars (init containers with restartPolicy Always) start before the main
containers and get SIGTERM once those have exited, as the kubelet does.

What one machine cannot give, and the only liberties taken:
- network: the pods share this machine's network namespace, so each pod's containerPorts listen on
  free loopback ports instead, and in-cluster names (Services, the operator's `<job>-master-0`)
  resolve to 127.0.0.1 and those ports. Occurrences of a pod's own containerPorts and of known
  `service:port` addresses in its command, args and env values are rewritten accordingly;
- volumes: each volumeMount's mountPath is a local directory (emptyDir: one per pod; a
  PersistentVolumeClaim: one per claim, shared by every pod that mounts it, as a ReadWriteMany
  volume is; Secret and ConfigMap volumes: their files written out), and occurrences of mount paths
  in command, args and env values are rewritten to those directories (`map_mount_paths`). Paths a
  program uses without the manifest naming them (code defaults under /tmp) stay this machine's;
- images: `python` is this interpreter; the services' entry points are this virtual environment's.
The operator's own `init-pytorch` container on Workers only waits for the Master's DNS name, which
here is loopback: it is not emulated. Nor is scheduling (Kueue admission, Volcano's PodGroups).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helm_chart import find
from tests.ports import free_port

VENV_BIN = Path(sys.executable).parent
LOOPBACK = "127.0.0.1"


def _container(pod: dict, name: str) -> dict:
    (found,) = [c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == name]
    return found


def operator_env(job: dict, role: str, index: int) -> dict[str, str]:
    """The variables Kubeflow Training Operator v1 (1.7 to 1.9) injects into every container of
    replica `role`/`index` (pkg/controller.v1/pytorch envvar.go setPodEnv, master.go, elastic.go)."""
    spec = job["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    name = job["metadata"]["name"]
    total = sum(r.get("replicas", 1) for r in replicas.values())
    nproc = spec.get("nprocPerNode", "auto")
    port = next(p["containerPort"] for p in _container(replicas["Master"]["template"]["spec"], "pytorch")["ports"]
                if p["name"] == "pytorchjob-port")
    node_rank = index + (1 if role == "Worker" else 0)
    env = {"PYTHONUNBUFFERED": "0",  # any non-empty value: unbuffered
           "PET_MASTER_ADDR": f"{name}-master-0", "PET_MASTER_PORT": str(port), "PET_NODE_RANK": str(node_rank),
           "PET_NPROC_PER_NODE": nproc,
           # Node-level, present only with a Master: what the trainer must never read.
           "MASTER_ADDR": f"{name}-master-0", "MASTER_PORT": str(port),
           "WORLD_SIZE": str(total * (int(nproc) if nproc.isdigit() else 1)), "RANK": str(node_rank)}
    elastic = spec.get("elasticPolicy")
    if elastic:
        host = elastic.get("rdzvHost", f"{name}-worker-0")
        env.update({"PET_RDZV_BACKEND": elastic.get("rdzvBackend", "c10d"),
                    "PET_RDZV_ENDPOINT": f"{host}:{elastic.get('rdzvPort', port)}",
                    "PET_NNODES": f"{elastic['minReplicas']}:{elastic['maxReplicas']}"})
        if "maxRestarts" in elastic:
            env["PET_MAX_RESTARTS"] = str(elastic["maxRestarts"])
    else:
        env["PET_NNODES"] = str(total)
    return env


# -- the rewriting of in-cluster paths and addresses ----------------------------------------------------


def map_mount_paths(value: str, mounts: dict[str, Path]) -> str:
    """`value` with each container mount path in it replaced by the local directory that stands in
    for it. Only whole paths count (/tmp in `HOME=/tmp` or `/tmp/x`, not in `/tmpfs` or `/a/tmp`);
    the longest mount wins (/var/run/secrets/x before /var), and replacements are never rewritten."""
    if not mounts:
        return value
    paths = "|".join(re.escape(path) for path in sorted(mounts, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w./-])({paths})(?![\w.-])")
    return pattern.sub(lambda match: str(mounts[match.group(1)]), value)


def map_network(value: str, endpoints: dict[str, str], ports: dict[int, int]) -> str:
    """`value` with known in-cluster `host:port` addresses replaced by their loopback `127.0.0.1:port`
    (`endpoints`) and the pod's own containerPorts, where they stand as a number of their own
    (`--port 8000`, `metrics_port=9400`), by the loopback ports they listen on instead (`ports`)."""
    addresses = "|".join(re.escape(a) for a in sorted(endpoints, key=len, reverse=True)) or "(?!)"
    pattern = re.compile(rf"(?<![\w.-])(?:(?P<address>{addresses})|(?P<port>\d+))(?![\w.])")

    def replace(match: re.Match) -> str:
        if match.group("address"):
            return endpoints[match.group("address")]
        return str(ports.get(int(match.group("port")), match.group("port")))

    return pattern.sub(replace, value)


def expand_env_references(value: str, env: dict[str, str]) -> str:
    """`value` with each $(NAME) of a variable in `env` replaced by its value, as the kubelet
    expands a container's command and args ($$ escapes a $; unknown names stay as written)."""
    def replace(match: re.Match) -> str:
        if match.group(0).startswith("$$"):
            return match.group(0)[1:]
        return env.get(match.group(1), match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", replace, value)


# -- containers, pods, the cluster ----------------------------------------------------------------------


class Container:
    """One started container: a process (leading its own process group) and its log file."""

    def __init__(self, pod: Pod, spec: dict, popen: subprocess.Popen, log_path: Path):
        self.pod, self.spec, self.popen, self.log_path = pod, spec, popen, log_path
        self.name = spec["name"]

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(f"{self} still running after {timeout:.0f}s\n{self.tail()}") from None

    def terminate(self) -> None:
        """SIGTERM to the container's main process, as the kubelet sends it."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the container's whole process group (torchrun's workers included), while
        its leader is not yet reaped (so the group id is still this container's)."""
        if self.popen.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def tail(self, chars: int = 4000) -> str:
        return f"--- {self} log (tail) ---\n{self.log()[-chars:]}"

    def events(self, event: str | None = None) -> list[dict]:
        """The JSON log lines (of one event), in order; other output is skipped."""
        found = []
        for line in self.log().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if event is None or record.get("event") == event:
                        found.append(record)
        return found

    def __str__(self) -> str:
        return f"{self.pod.name}/{self.name}"


class Pod:
    def __init__(self, cluster: Cluster, name: str, template: dict, annotations: dict[str, str] | None = None):
        self.cluster, self.name = cluster, name
        self.spec = template["spec"]
        self.labels = template.get("metadata", {}).get("labels", {})
        # The template's, plus what the controller adds (the Job controller: the completion index).
        self.annotations = {**(template.get("metadata", {}).get("annotations") or {}), **(annotations or {})}
        self.dir = cluster.root / "pods" / name
        self.dir.mkdir(parents=True)
        self.volumes = {v["name"]: cluster.volume(self, v) for v in self.spec.get("volumes", [])}
        self.ports = {p["containerPort"]: free_port() for c in self._all_containers() for p in c.get("ports", [])}
        self.containers: dict[str, Container] = {}

    def _all_containers(self) -> list[dict]:
        return self.spec.get("initContainers", []) + self.spec["containers"]

    def container_spec(self, name: str) -> dict:
        return _container(self.spec, name)

    def port(self, ref: int | str) -> int:
        """The loopback port of a containerPort, by number or by name."""
        for c in self._all_containers():
            for p in c.get("ports", []):
                if ref in (p["containerPort"], p.get("name")):
                    return self.ports[p["containerPort"]]
        raise KeyError(f"pod {self.name} declares no containerPort {ref!r}")

    def mounts(self, spec: dict) -> dict[str, Path]:
        return {m["mountPath"]: self.volumes[m["name"]] / m.get("subPath", "") for m in spec.get("volumeMounts", [])}

    def mounted(self, spec: dict, path: str) -> Path:
        """The local file standing in for `path` inside container `spec`."""
        local = map_mount_paths(path, self.mounts(spec))
        assert local != path, f"{path} is on no volume of {self.name}/{spec['name']}"
        return Path(local)

    def localize(self, spec: dict, value: str) -> str:
        return map_mount_paths(map_network(value, self.cluster.endpoints, self.ports), self.mounts(spec))

    def argv(self, spec: dict, env: dict[str, str]) -> list[str]:
        """The command and args, with $(VAR) references to the container's `env` expanded as the
        kubelet does, and in-cluster paths and addresses made local."""
        if not spec.get("command"):
            raise ValueError(f"{self.name}/{spec['name']}: no command (the image's entrypoint is not known here)")
        program, *rest = spec["command"]
        if program == "python":
            executable = sys.executable
        else:
            executable = shutil.which(program, path=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
            if executable is None:
                raise FileNotFoundError(f"{self.name}/{spec['name']}: command {program!r} not found")
        words = [*rest, *spec.get("args", [])]
        return [executable, *(self.localize(spec, expand_env_references(word, env)) for word in words)]

    def env(self, spec: dict, injected: dict[str, str]) -> dict[str, str]:
        """PATH and HOME (a process needs them; the image would set them), then the container's
        declared env, then what the controller injects (never the same names)."""
        if spec.get("envFrom"):
            raise NotImplementedError(f"{self.name}/{spec['name']}: envFrom")
        declared = {e["name"]: self.localize(spec, self.cluster.env_value(self, e)) for e in spec.get("env", [])}
        clash = set(declared) & set(injected)
        assert not clash, f"{self.name}/{spec['name']} declares {sorted(clash)}, which its controller injects"
        home = self.dir / "home"
        home.mkdir(exist_ok=True)
        return {"PATH": f"{VENV_BIN}{os.pathsep}/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
                **declared, **injected}

    def start(self, name: str, injected: dict[str, str] | None = None) -> Container:
        spec = self.container_spec(name)
        log_path = self.dir / "logs" / f"{name}.log"
        log_path.parent.mkdir(exist_ok=True)
        env = self.env(spec, injected or {})
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(self.argv(spec, env), env=env, cwd=self.dir, stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        started = self.containers[name] = Container(self, spec, popen, log_path)
        self.cluster.started.append(started)
        return started

    def run_init_containers(self, timeout: float, injected: dict[str, str] | None = None) -> None:
        """Init containers in order: each runs to completion (exit 0 required) before the next;
        a native sidecar (restartPolicy Always) is started and left running. `injected`: what the
        controller adds to every container (the Job controller: JOB_COMPLETION_INDEX)."""
        for spec in self.spec.get("initContainers", []):
            started = self.start(spec["name"], injected)
            if spec.get("restartPolicy") == "Always":
                continue
            code = started.wait(timeout)
            assert code == 0, f"init container {started} exited {code}\n{started.tail()}"

    def start_main(self, injected: dict[str, str] | None = None) -> list[Container]:
        return [self.start(spec["name"], injected) for spec in self.spec["containers"]]

    def main(self) -> list[Container]:
        return [self.containers[c["name"]] for c in self.spec["containers"] if c["name"] in self.containers]

    def sidecars(self) -> list[Container]:
        return [self.containers[c["name"]] for c in self.spec.get("initContainers", [])
                if c.get("restartPolicy") == "Always" and c["name"] in self.containers]

    def stop_sidecars(self) -> None:
        """What the kubelet does once the main containers have exited: SIGTERM the sidecars (in
        reverse order) and wait for them, at most the termination grace period."""
        grace = self.spec.get("terminationGracePeriodSeconds", 30)
        for sidecar in reversed(self.sidecars()):
            sidecar.terminate()
            sidecar.wait(grace)

    def terminate(self) -> None:
        """Pod deletion: SIGTERM every container, wait the grace period, then SIGKILL."""
        deadline = time.monotonic() + self.spec.get("terminationGracePeriodSeconds", 30)
        for started in [*self.main(), *reversed(self.sidecars())]:
            started.terminate()
            with contextlib.suppress(TimeoutError):
                started.wait(max(deadline - time.monotonic(), 1))

    def exit_codes(self) -> dict[str, int | None]:
        return {name: c.poll() for name, c in self.containers.items()}

    def report(self) -> str:
        return "\n".join(c.tail() for c in self.containers.values())


class Cluster:
    """Directories for volumes, the Secrets (a dict: name → key → value), the rendered objects
    (ConfigMaps, Services), the loopback endpoints of in-cluster addresses, and every container
    started (killed, with their process groups, on close)."""

    def __init__(self, root: Path, objects: list[dict], secrets: dict[str, dict[str, str]], namespace: str = "ml"):
        self.root, self.objects, self.secrets, self.namespace = root, objects, secrets, namespace
        self.endpoints: dict[str, str] = {}
        self.started: list[Container] = []
        root.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for started in self.started:
            if started.poll() is None:
                started.kill()

    def pod(self, name: str, template: dict, annotations: dict[str, str] | None = None) -> Pod:
        return Pod(self, name, template, annotations)

    def claim(self, name: str) -> Path:
        """The directory standing in for PersistentVolumeClaim `name` (shared by its pods)."""
        path = self.root / "claims" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def volume(self, pod: Pod, volume: dict) -> Path:
        if "persistentVolumeClaim" in volume:
            return self.claim(volume["persistentVolumeClaim"]["claimName"])
        path = pod.dir / "volumes" / volume["name"]
        path.mkdir(parents=True)
        if "emptyDir" in volume:
            return path
        if "secret" in volume:
            data = self.secrets[volume["secret"]["secretName"]]
            items = volume["secret"].get("items")
        elif "configMap" in volume:
            (configmap,) = find(self.objects, "ConfigMap", volume["configMap"]["name"])
            data, items = configmap.get("data", {}), volume["configMap"].get("items")
        else:
            raise NotImplementedError(f"volume {volume['name']} of pod {pod.name}: {sorted(volume)}")
        for item in items or [{"key": key, "path": key} for key in data]:
            target = path / item["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(data[item["key"]])
        return path

    def env_value(self, pod: Pod, entry: dict) -> str:
        if "valueFrom" not in entry:
            return entry.get("value", "")
        source = entry["valueFrom"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            return self.secrets[ref["name"]][ref["key"]]
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            (configmap,) = find(self.objects, "ConfigMap", ref["name"])
            return configmap["data"][ref["key"]]
        if "fieldRef" in source:
            fields = {"metadata.name": pod.name, "metadata.namespace": self.namespace, "status.podIP": LOOPBACK,
                      "status.hostIP": LOOPBACK, "spec.nodeName": "localhost",
                      "spec.serviceAccountName": pod.spec.get("serviceAccountName", "default")}
            path = source["fieldRef"]["fieldPath"]
            if keyed := re.fullmatch(r"metadata\.(annotations|labels)\['([^']+)'\]", path):
                return getattr(pod, keyed.group(1))[keyed.group(2)]
            return fields[path]
        raise NotImplementedError(f"env {entry['name']}: {sorted(source)}")

    def register(self, host: str, port: int, loopback_port: int) -> None:
        """In-cluster `host:port` (and its namespace-qualified DNS forms) → 127.0.0.1:loopback_port."""
        for name in (host, f"{host}.{self.namespace}", f"{host}.{self.namespace}.svc",
                     f"{host}.{self.namespace}.svc.cluster.local"):
            self.endpoints[f"{name}:{port}"] = f"{LOOPBACK}:{loopback_port}"

    def expose(self, service: str, pod: Pod) -> None:
        """Rendered Service `service` → `pod`, which its selector must select."""
        (svc,) = find(self.objects, "Service", service)
        selector = svc["spec"].get("selector", {})
        assert selector and selector.items() <= pod.labels.items(), \
            f"Service {service} selects {selector}; pod {pod.name} has labels {pod.labels}: no endpoints"
        for port in svc["spec"]["ports"]:
            self.register(service, port["port"], pod.port(port.get("targetPort", port["port"])))


# -- controllers ---------------------------------------------------------------------------------------


def on_loopback(env: dict[str, str], cluster: Cluster) -> dict[str, str]:
    """The operator's variables with the Services it names (the Master's, the rendezvous host's)
    resolved to their loopback addresses."""
    local = dict(env)
    for addr, port in (("PET_MASTER_ADDR", "PET_MASTER_PORT"), ("MASTER_ADDR", "MASTER_PORT")):
        if addr in local:
            local[addr], local[port] = cluster.endpoints[f"{local[addr]}:{local[port]}"].rsplit(":", 1)
    if "PET_RDZV_ENDPOINT" in local:
        local["PET_RDZV_ENDPOINT"] = cluster.endpoints[local["PET_RDZV_ENDPOINT"]]
    return local


def launch_pytorchjob(cluster: Cluster, job: dict, timeout: float) -> list[Pod]:
    """What the Training Operator and the kubelets do with `job`: a pod per replica (Master first)
    and a Service per pod on its `pytorchjob-port`; in each pod the init containers in order, then
    the sidecars and the main containers with the operator's variables. Waits until every main
    container has exited (stopping all of them if one fails), then stops each pod's sidecars.
    Returns the pods; their containers' exit codes are the caller's to check."""
    name = job["metadata"]["name"]
    pods: list[tuple[str, int, Pod]] = []
    for role in sorted(job["spec"]["pytorchReplicaSpecs"], key=lambda r: r != "Master"):
        replica = job["spec"]["pytorchReplicaSpecs"][role]
        for index in range(replica.get("replicas", 1)):
            pod = cluster.pod(f"{name}-{role.lower()}-{index}", replica["template"])
            port = next(p["containerPort"] for p in pod.container_spec("pytorch")["ports"]
                        if p["name"] == "pytorchjob-port")
            cluster.register(pod.name, port, pod.port(port))
            pods.append((role, index, pod))
    for role, index, pod in pods:
        pod.run_init_containers(timeout)
        pod.start_main(on_loopback(operator_env(job, role, index), cluster))
    return _until_the_main_containers_exit([pod for _, _, pod in pods], timeout)


def _until_the_main_containers_exit(pods: list[Pod], timeout: float) -> list[Pod]:
    """Wait until every main container has exited (stopping all of them if one fails or the
    time is up), then stop each pod's sidecars, as the kubelet does once its main containers end."""
    deadline = time.monotonic() + timeout
    running = [c for pod in pods for c in pod.main()]
    while running:
        failed = [c for c in running if c.poll() not in (None, 0)]
        if failed or time.monotonic() > deadline:
            for c in running:
                c.kill()
            break
        running = [c for c in running if c.poll() is None]
        time.sleep(0.2)
    for pod in pods:
        pod.stop_sidecars()
    return pods


# -- Kubeflow Trainer v2 -----------------------------------------------------------------------------

TRAINER_PORT = 29500  # Trainer v2's rendezvous port (pkg/constants ContainerTrainerPort)
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # the Job controller's pod annotation


def trainjob_node_template(trainjob: dict, runtime: dict) -> tuple[dict, int]:
    """The trainer's pod template and pod count as Kubeflow Trainer v2 builds the JobSet from the
    TrainingRuntime and the TrainJob (v2.2: plugins/jobset builder.go, plugins/torch torch.go):
    the replicated job labelled trainjob-ancestor-step trainer (one Job, numNodes pods); in its
    `node` container the TrainJob's trainer image, command, args and env, and the rendezvous
    port. The PET_* variables come separately (trainer_env), as the operator's do."""
    assert trainjob["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime",
                                              "name": runtime["metadata"]["name"]}
    assert "torch" in runtime["spec"]["mlPolicy"], "the torch plugin sets torchrun's variables"
    (replicated,) = [r for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]
                     if r["template"]["metadata"]["labels"].get("trainer.kubeflow.org/trainjob-ancestor-step")
                     == "trainer"]
    assert replicated["name"] == "node"
    template = copy.deepcopy(replicated["template"]["spec"]["template"])
    node = _container(template["spec"], "node")
    trainer = trainjob["spec"].get("trainer") or {}
    node.update({key: trainer[key] for key in ("image", "command", "args") if key in trainer})
    if trainer.get("env") or trainer.get("resourcesPerNode"):
        raise NotImplementedError("trainer.env / trainer.resourcesPerNode of a TrainJob")
    ports = [p for p in node.get("ports", []) if p["containerPort"] != TRAINER_PORT]
    node["ports"] = [*ports, {"containerPort": TRAINER_PORT}]  # upserted, by port or name
    nodes = trainer.get("numNodes", runtime["spec"]["mlPolicy"].get("numNodes", 1))
    return template, nodes


def trainer_env(trainjob: dict, index: int) -> dict[str, str]:
    """What Trainer v2's torch plugin sets in the `node` container of pod `index` for torchrun
    (PET_NODE_RANK is a reference to the pod's completion index, resolved here)."""
    name = trainjob["metadata"]["name"]
    trainer = trainjob["spec"]["trainer"]
    assert "numProcPerNode" in trainer, "without it Trainer derives the processes from the resources"
    return {"PET_NNODES": str(trainer["numNodes"]), "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
            "PET_NODE_RANK": str(index),
            "PET_MASTER_ADDR": f"{name}-node-0-0.{name}", "PET_MASTER_PORT": str(TRAINER_PORT)}


def launch_trainjob(cluster: Cluster, trainjob: dict, runtime: dict, timeout: float) -> list[Pod]:
    """What Trainer v2, JobSet, the Job controller and the kubelets do with `trainjob`: its node
    Job's pods <job>-node-0-<index> (each annotated with its completion index, JOB_COMPLETION_INDEX
    in every container), the headless Service's name of pod 0 (<job>-node-0-0.<job>) on the
    rendezvous port; in each pod the init containers in order, then the sidecars and the `node`
    container with Trainer's variables. Waits as launch_pytorchjob does; returns the pods, node
    rank 0 first."""
    name = trainjob["metadata"]["name"]
    template, nodes = trainjob_node_template(trainjob, runtime)
    pods = [cluster.pod(f"{name}-node-0-{index}", template, annotations={COMPLETION_INDEX: str(index)})
            for index in range(nodes)]
    cluster.register(f"{name}-node-0-0.{name}", TRAINER_PORT, pods[0].port(TRAINER_PORT))
    for index, pod in enumerate(pods):
        job_env = {"JOB_COMPLETION_INDEX": str(index)}
        pod.run_init_containers(timeout, job_env)
        pod.start_main({**job_env, **on_loopback(trainer_env(trainjob, index), cluster)})
    return _until_the_main_containers_exit(pods, timeout)


def run_job_pod(cluster: Cluster, pod_name: str, template: dict, timeout: float,
                injected: dict[str, str] | None = None) -> Pod:
    """One pod of a Job (restartPolicy Never): init containers, then the main containers until
    they exit. `injected`: what the Job controller adds (JOB_COMPLETION_INDEX)."""
    pod = cluster.pod(pod_name, template)
    pod.run_init_containers(timeout)
    for started in pod.start_main(injected):
        started.wait(timeout)
    pod.stop_sidecars()
    return pod


def probe_url(pod: Pod, container: str, probe: str) -> str:
    """The URL the kubelet would poll for a container's httpGet probe (`readinessProbe`, …)."""
    get = pod.container_spec(container)[probe]["httpGet"]
    return f"{get.get('scheme', 'HTTP').lower()}://{LOOPBACK}:{pod.port(get['port'])}{get.get('path', '/')}"
