"""Value sets the chart is rendered with in the deploy tests, and helpers to walk what it renders."""

from __future__ import annotations

from functools import cache

from tests.helm_chart import render

CRD_KINDS = {"PyTorchJob", "TrainJob", "TrainingRuntime", "ServiceMonitor", "PodMonitor", "PrometheusRule"}
KUBE_VERSION = "1.30.0"
NAMESPACE = "ml"

# Data prep and training on CPU only: what a cluster without GPUs (or kind) runs.
CPU_ONLY = {
    "s3": {"endpointUrl": "http://minio.storage:9000", "credentialsSecret": "lmforge-s3"},
    "dataprep": {"enabled": True, "workers": 4, "parallelism": 2, "config": {
        # a composed pipeline: a step of the user's own id, typed, between built-in ones
        "pipeline": ["url_dedup", "exact_dedup", "langid", "quality", "pii"],
        "steps": {"langid": {"threshold": 0.5},
                  "quality": {"type": "classifier", "model_path": "s3://models/quality.bin", "keep_if": {"hq": 0.5}}}}},
    "training": {
        "enabled": True,
        "nprocPerNode": 2,
        "config": {
            "model": {"preset": "tiny", "overrides": {"n_layer": 2}},
            "data": {"sources": [{"path": "s3://lmforge/datasets/cc-main-2024-22"}], "seq_len": 128},
            "parallel": {"mode": "fsdp"},
            "optim": {"lr": 3e-4, "betas": [0.9, 0.95], "schedule": "wsd"},
            "tracking": {"run_name": "cpu smoke"},
            "steps": 200,
        },
        "uploader": {"config": {"transfer": {"concurrency": 4}, "poll_seconds": 5}},
    },
    "inference": {
        "apiKeys": {"secretName": "lmforge-api-keys"},
        "autoscaling": {"enabled": False},
        "replicas": 1,
        "pdb": {"minAvailable": 0},
        "config": {"engine": {"max_running": 4}},
    },
    "canary": {"config": {"tolerance": {"max_perplexity_increase_ratio": 0.05}}},
}

# Four 8-GPU nodes with elastic rendezvous, gang-scheduled by Volcano; GPU serving, custom-metric
# autoscaling.
MULTI_NODE_GPU = {
    "image": {"registry": "ghcr.io/example", "tag": "1.2.3", "pullPolicy": "Always", "pullSecrets": ["ghcr"]},
    "s3": {"credentialsSecret": "lmforge-s3", "region": "us-east-1"},
    "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/lmforge"}},
    "dataprep": {"enabled": True, "workers": 64, "parallelism": 32, "processesPerWorker": 4,
                 "stages": {"dedup": {"tasks": 32, "parallelism": 16},
                            "shards": {"tasks": 64, "parallelism": 32, "processes": 2}}},
    "training": {
        "enabled": True,
        "run": "cc-1p3b-v1",
        "nodes": 4,
        "nprocPerNode": 8,
        "gpusPerProcess": 1,
        "elastic": {"enabled": True, "minNodes": 2, "maxNodes": 4, "maxRestarts": 5},
        "scheduling": {"volcano": {"queue": "training", "minAvailable": 2}},
        "checkpoints": {"persistentVolumeClaim": "lmforge-checkpoints"},
        "shmSize": "64Gi",
        "resources": {"requests": {"cpu": "32", "memory": "512Gi"}, "limits": {"cpu": "96", "memory": "1024Gi"}},
        "config": {
            "model": {"preset": "1.3b"},
            "data": {"sources": [{"path": "s3://lmforge/datasets/cc-main-2024-22", "weight": 1.0}],
                     "seq_len": 1024, "batch_size": 16},
            "parallel": {"mode": "hsdp", "replicate_degree": 4, "activation_checkpointing": True},
            "checkpoint": {"every": 500, "keep": 2},
            "steps": 50000,
        },
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "trainer"}}}]}},
        "priorityClassName": "training-high",
    },
    "inference": {
        "model": "s3://lmforge/runs/cc-1p3b-v1/models/v3",
        "modelName": "lmforge-1.3b",
        "gpus": 1,
        "apiKeys": {"secretName": "lmforge-api-keys", "key": "api-keys"},
        "autoscaling": {"minReplicas": 2, "maxReplicas": 16, "metrics": [{
            "type": "Pods",
            "pods": {"metric": {"name": "lmforge_inference_requests_waiting"},
                     "target": {"type": "AverageValue", "averageValue": "8"}}}]},
        "pdb": {"minAvailable": "50%"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
    "canary": {"timeZone": "Europe/Paris", "apiKey": {"secretName": "lmforge-canary-key", "key": "key"}},
    "monitoring": {"additionalLabels": {"release": "kube-prometheus-stack"}},
}

# Kubeflow Trainer v2: a TrainJob on its own TrainingRuntime, two 4-GPU nodes on a shared claim,
# admitted whole by Kueue.
TRAINJOB_KUEUE = {
    "image": {"registry": "registry.example.com/ml", "tag": "1.2.3"},
    "s3": {"endpointUrl": "http://minio.storage:9000", "credentialsSecret": "lmforge-s3"},
    "training": {
        "enabled": True,
        "operator": "trainjob",
        "run": "trainer-v2-run",
        "nodes": 2,
        "nprocPerNode": 4,
        "gpusPerProcess": 1,
        "restartPolicy": "Never",
        "backoffLimit": 2,
        "checkpoints": {"persistentVolumeClaim": "lmforge-checkpoints"},
        "scheduling": {"kueue": {"queueName": "team-ml"}},
        "config": {
            "model": {"preset": "350m"},
            "data": {"sources": [{"path": "s3://lmforge/datasets/cc-main-2024-22"}], "seq_len": 512},
            "parallel": {"mode": "fsdp"},
            "steps": 20000,
        },
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "training-high",
    },
}

# A cluster that has its own Prometheus, Grafana, Pushgateway and collector, and no operator CRDs.
OBSERVABILITY_OFF = {
    "dataprep": {"enabled": True},
    "training": {"enabled": True},
    "monitoring": {"serviceMonitors": {"enabled": False}, "prometheusRule": {"enabled": False},
                   "rulesConfigMap": {"enabled": False}, "dashboards": {"enabled": False}},
    "kube-prometheus-stack": {"enabled": False},
    "prometheus-pushgateway": {"enabled": False},
    "opentelemetry-collector": {"enabled": False},
}

CANARY_OFF = {"canary": {"enabled": False}}

# vLLM's OpenAI server on 2-GPU replicas (tensor parallel), on the Hugging Face format export the
# model pointer names; the platform's API keys, autoscaling on its queue, monitoring.
VLLM = {
    "s3": {"endpointUrl": "http://minio.storage:9000", "credentialsSecret": "lmforge-s3"},
    "inference": {
        "backend": "vllm",
        "model": "s3://lmforge/models/current",
        "modelName": "lmforge-hf",
        "gpus": 2,
        "vllm": {"dtype": "bfloat16", "maxModelLen": 4096, "gpuMemoryUtilization": 0.85, "tensorParallelSize": 2,
                 "extraArgs": ["--enable-prefix-caching", "--max-num-seqs", "64"]},
        "apiKeys": {"secretName": "lmforge-api-keys", "key": "api-keys"},
        "autoscaling": {"minReplicas": 1, "maxReplicas": 4, "metrics": [{
            "type": "Pods",
            "pods": {"metric": {"name": "lmforge_inference_requests_waiting"},
                     "target": {"type": "AverageValue", "averageValue": "8"}}}]},
        "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"cpu": "16", "memory": "128Gi"}},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
    "monitoring": {"additionalLabels": {"release": "kube-prometheus-stack"}},
}

VALUE_SETS = {
    "default": {},
    "cpu-only": CPU_ONLY,
    "multi-node-gpu": MULTI_NODE_GPU,
    "trainjob-kueue": TRAINJOB_KUEUE,
    "observability-off": OBSERVABILITY_OFF,
    "canary-off": CANARY_OFF,
    "vllm": VLLM,
}


@cache
def rendered(name: str) -> tuple[dict, ...]:
    return tuple(render(VALUE_SETS[name], namespace=NAMESPACE))


def pod_templates(obj: dict) -> list[tuple[str, dict]]:
    """(where, pod template: metadata and spec) of every pod template in a workload object."""
    kind, spec = obj["kind"], obj.get("spec", {})
    if kind in ("Deployment", "Job"):
        return [(kind, spec["template"])]
    if kind == "CronJob":
        return [(kind, spec["jobTemplate"]["spec"]["template"])]
    if kind == "PyTorchJob":
        return [(f"PyTorchJob/{role}", replica["template"]) for role, replica in spec["pytorchReplicaSpecs"].items()]
    if kind == "TrainingRuntime":
        return [(f"TrainingRuntime/{job['name']}", job["template"]["spec"]["template"])
                for job in spec["template"]["spec"]["replicatedJobs"]]
    return []


def pod_specs(obj: dict) -> list[tuple[str, dict]]:
    """(where, pod spec) of every pod template in a workload object."""
    return [(where, template["spec"]) for where, template in pod_templates(obj)]


def containers(pod: dict) -> list[dict]:
    return pod.get("initContainers", []) + pod["containers"]


def container(pod: dict, name: str) -> dict:
    (found,) = [c for c in containers(pod) if c["name"] == name]
    return found


def set_values(args: list[str]) -> list[str]:
    """The KEY=VALUE of every `--set KEY=VALUE` pair."""
    return [args[i + 1] for i, arg in enumerate(args) if arg == "--set"]
