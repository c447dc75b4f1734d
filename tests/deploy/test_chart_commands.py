"""Every container the chart renders runs a command the real CLIs accept: each service's own
argparse parser, torchrun's parser (with the variables the Kubeflow Training Operator v1 or Trainer
v2 injects), and each service's config loader for the overrides the chart passes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed.run as torchrun
import yaml

from lmforge.canary.cli import CLI as CANARY
from lmforge.canary.evalset import load_eval_set
from lmforge.dataprep.cli import CLI as DATAPREP
from lmforge.dataprep.config import load_dataprep_config
from lmforge.dataprep.stages import DEFAULT_MAX_ROUNDS, GLOBAL_STAGES, ROUNDS, stage
from lmforge.inference.cli import CLI as SERVE
from lmforge.trainer import __main__ as trainer_main
from lmforge.trainer.config import TrainConfig
from lmforge.uploader.cli import CLI as UPLOADER
from lmforge.uploader.config import load_uploader_config
from tests.deploy.chart_values import VALUE_SETS, container, containers, pod_specs, rendered, set_values
from tests.deploy.emulation import TRAINER_PORT, expand_env_references, operator_env, trainer_env
from tests.helm_chart import find

SETS = sorted(VALUE_SETS)
OPERATOR_NODE_VARIABLES = {"WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No LMFORGE_* / PET_* leftovers from the environment; torchrun may set OMP_NUM_THREADS."""
    import os

    for key in list(os.environ):
        if key.startswith(("LMFORGE_", "PET_", "TORCHELASTIC_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


# -- torchrun + the trainer ---------------------------------------------------------------------


def _trainer_config(args: list[str], monkeypatch) -> TrainConfig:
    """Run the trainer's own entry point on `args` with training replaced by capturing its config."""
    captured = []
    monkeypatch.setattr(trainer_main, "train", captured.append)
    assert trainer_main.main(args) == 0
    (config,) = captured
    return config


@pytest.mark.parametrize("name", ["cpu-only", "multi-node-gpu", "observability-off"])
def test_pytorch_containers_run_torchrun_driven_by_the_operator_variables(name, monkeypatch):
    (job,) = find(list(rendered(name)), "PyTorchJob")
    for role, replica in job["spec"]["pytorchReplicaSpecs"].items():
        trainer = container(replica["template"]["spec"], "pytorch")
        assert trainer["command"] == ["python", "-m", "torch.distributed.run"]
        # Node count, node rank, processes and rendezvous come from PET_* only: a flag would override them.
        assert not any(a.startswith(("--nnodes", "--node", "--nproc", "--master", "--rdzv", "--standalone"))
                       for a in trainer["args"])
        assert not OPERATOR_NODE_VARIABLES & {e["name"] for e in trainer["env"]}
        for index in range(replica["replicas"]):
            env = operator_env(job, role, index)
            for key, value in env.items():
                monkeypatch.setenv(key, value)
            args = torchrun.get_args_parser().parse_args(trainer["args"])
            config, entry, entry_args = torchrun.config_from_args(args)
            assert args.module and args.training_script == "lmforge.trainer"
            assert entry_args == ["-u", "-m", "lmforge.trainer", *args.training_script_args]
            assert config.nproc_per_node == int(job["spec"]["nprocPerNode"])
            if "elasticPolicy" in job["spec"]:
                elastic = job["spec"]["elasticPolicy"]
                assert (config.min_nodes, config.max_nodes) == (elastic["minReplicas"], elastic["maxReplicas"])
                assert config.rdzv_backend == "c10d" and config.max_restarts == elastic["maxRestarts"]
                assert config.rdzv_endpoint == f"{job['metadata']['name']}-master-0:23456"
            else:
                total = sum(r["replicas"] for r in job["spec"]["pytorchReplicaSpecs"].values())
                assert (config.min_nodes, config.max_nodes) == (total, total)
                assert config.rdzv_backend == "static" and config.rdzv_configs["rank"] == int(env["PET_NODE_RANK"])
                assert config.rdzv_endpoint == f"{env['PET_MASTER_ADDR']}:{env['PET_MASTER_PORT']}"
            train = _trainer_config(args.training_script_args, monkeypatch)
            assert train.run_dir == f"/checkpoints/{job['metadata']['annotations']['lmforge.io/run']}"
            assert train.metrics.port == 9402 and train.data.cache_dir == "/cache/data"
            assert train.checkpoint.purge_requires_upload is True
            assert train.device == ("cuda" if name == "multi-node-gpu" else "cpu")


def test_node_containers_run_torchrun_driven_by_trainer_v2s_variables(monkeypatch):
    objects = list(rendered("trainjob-kueue"))
    (runtime,) = find(objects, "TrainingRuntime")
    (trainjob,) = find(objects, "TrainJob")
    name = trainjob["metadata"]["name"]
    (replicated,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    trainer = container(replicated["template"]["spec"]["template"]["spec"], "node")
    assert trainer["command"] == ["python", "-m", "torch.distributed.run"]
    assert not any(a.startswith(("--nnodes", "--node", "--nproc", "--master", "--rdzv", "--standalone"))
                   for a in trainer["args"])
    nodes = trainjob["spec"]["trainer"]["numNodes"]
    for index in range(nodes):
        env = trainer_env(trainjob, index)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        args = torchrun.get_args_parser().parse_args(trainer["args"])
        config, _, _ = torchrun.config_from_args(args)
        assert config.nproc_per_node == trainjob["spec"]["trainer"]["numProcPerNode"] == 4
        assert (config.min_nodes, config.max_nodes) == (nodes, nodes)
        assert config.rdzv_backend == "static" and config.rdzv_configs["rank"] == index
        assert config.rdzv_endpoint == f"{name}-node-0-0.{name}:{TRAINER_PORT}"
        train = _trainer_config(args.training_script_args, monkeypatch)
        assert train.run_dir == "/checkpoints/trainer-v2-run" and train.device == "cuda"
        assert train.model.preset == "350m" and train.checkpoint.purge_requires_upload is True


def test_trainer_overrides_keep_their_types(monkeypatch):
    (job,) = find(list(rendered("cpu-only")), "PyTorchJob")
    args = container(job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"], "pytorch")["args"]
    config = _trainer_config(args[2:], monkeypatch)
    assert config.model.preset == "tiny" and config.model.overrides == {"n_layer": 2}
    assert config.data.sources[0].path == "s3://lmforge/datasets/cc-main-2024-22" and config.data.seq_len == 128
    assert config.optim.lr == pytest.approx(3e-4) and config.optim.betas == (0.9, 0.95)
    assert config.optim.schedule == "wsd" and config.parallel.mode == "fsdp"
    assert config.tracking.run_name == "cpu smoke" and config.steps == 200
    assert config.checkpoint.every == 100  # a chart default merged with the set's keys
    (gpu_job,) = find(list(rendered("multi-node-gpu")), "PyTorchJob")
    gpu_args = container(gpu_job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"], "pytorch")["args"]
    gpu = _trainer_config(gpu_args[2:], monkeypatch)
    assert gpu.model.preset == "1.3b" and gpu.parallel.mode == "hsdp" and gpu.parallel.replicate_degree == 4
    assert gpu.parallel.activation_checkpointing is True and gpu.run_dir == "/checkpoints/cc-1p3b-v1"


# -- the other services ---------------------------------------------------------------------------


def _containers(name: str, image: str):
    for obj in rendered(name):
        for where, pod in pod_specs(obj):
            for c in containers(pod):
                if f"lmforge/{image}:" in c["image"]:
                    yield f"{obj['metadata']['name']} ({where}) {c['name']}", pod, c


@pytest.mark.parametrize("name", SETS)
def test_uploader_restore_and_watch_commands(name):
    found = list(_containers(name, "uploader"))
    if not any(o["kind"] in ("PyTorchJob", "TrainingRuntime") for o in rendered(name)):
        assert found == []
        return
    for where, pod, c in found:
        assert c["command"] == ["lmforge-uploader"], where
        # The kubelet expands $(LMFORGE_NODE_RANK) (a TrainJob pod's completion index), here node rank 1's.
        env = {e["name"] for e in c["env"]}
        args = UPLOADER.parse_args([expand_env_references(a, {"LMFORGE_NODE_RANK": "1"}) for a in c["args"]])
        assert args.node_rank == (1 if "LMFORGE_NODE_RANK" in env else 0), where
        assert ("LMFORGE_NODE_RANK" in env) == (name == "trainjob-kueue"), where  # one template, a shared claim
        config = UPLOADER.load_config(args)
        trainer_args = next(x for x in pod["containers"] if x["name"] in ("pytorch", "node"))["args"]
        run_dir = next(a.split("=", 1)[1] for a in trainer_args if a.startswith("run_dir="))
        assert args.dir == f"{run_dir}/checkpoints", where  # the directory the trainer writes
        uri = args.dest if args.command == "watch" else args.src
        assert uri.startswith("s3://") and uri.endswith("/" + Path(run_dir).name)
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert mounts["/checkpoints"] == "checkpoints"
        if args.command == "watch":
            (port,) = [p["containerPort"] for p in c["ports"] if p["name"] == "uploader-metrics"]
            assert config.metrics_port == port
            assert config.grace_seconds + 30 <= pod["terminationGracePeriodSeconds"]
        else:
            assert args.step is None  # the newest complete checkpoint
    if name == "cpu-only":
        assert {load_uploader_config(None, set_values(c["args"])).transfer.concurrency for _, _, c in found} == {4}


@pytest.mark.parametrize("name", SETS)
def test_dataprep_commands(name):
    commands = []
    for where, _pod, c in _containers(name, "dataprep"):
        assert c["command"] == ["lmforge-dataprep"], where
        args = DATAPREP.parse_args(c["args"])  # exits (SystemExit) on an unknown command or flag
        commands.append(args.command)
        assert args.output.startswith("s3://")
        if args.command == "run":
            assert args.worker_index is None and args.num_workers >= 1  # index from JOB_COMPLETION_INDEX
            DATAPREP.load_config(args)
            if name == "cpu-only":
                config = load_dataprep_config(None, args.overrides)
                assert config.steps.langid.threshold == 0.5
                assert config.pipeline == ["url_dedup", "exact_dedup", "langid", "quality", "pii"]
                assert config.steps.quality.type == "classifier" and config.steps.quality.keep_if == {"hq": 0.5}
            assert (args.pushgateway is None) == (name == "observability-off")
        else:  # a global stage: its Job's tasks split as the CLI splits them
            assert not args.overrides and DATAPREP.load_config(args) is None  # reuses the workers' recorded config
            if stage(args.command).split:
                assert args.worker_index is None and args.num_workers >= 1 and args.workers >= 1, where
            if stage(args.command).kind == ROUNDS:
                assert args.round == commands.count(args.command) - 1, where  # one Job per round, in order
    # trace-index's Job exists only with config trace_index.enabled (none of these sets): test_chart_trace.py
    expected = ["run"] + [s.name for s in GLOBAL_STAGES for _ in range(DEFAULT_MAX_ROUNDS if s.kind == ROUNDS else 1)
                          if s.name != "trace-index"]
    assert commands in ([], expected)


@pytest.mark.parametrize("name", [n for n in SETS if n != "vllm"])  # vLLM's pod: test_chart_vllm.py
def test_inference_command(name):
    (found,) = list(_containers(name, "inference"))
    where, pod, c = found
    assert c["command"] == ["lmforge-serve"]
    args = SERVE.parse_args(c["args"])
    config = SERVE.load_config(args)  # as lmforge-serve's main() builds it
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert config.port == ports["http"] and config.metrics_port == ports["metrics"] and config.host == "0.0.0.0"
    assert config.model.startswith("s3://") and config.cache_dir.startswith("/tmp/")
    if name == "multi-node-gpu":
        assert config.model_name == "lmforge-1.3b" and config.api_keys_file == "/var/run/secrets/lmforge/api-keys/keys"
    if name == "cpu-only":
        assert config.engine.max_running == 4
    if name == "default":
        assert config.api_keys_file is None


@pytest.mark.parametrize("name", [n for n in SETS if n != "canary-off"])
def test_canary_command_and_eval_set(name, tmp_path):
    (found,) = list(_containers(name, "canary"))
    where, pod, c = found
    assert c["command"] == ["lmforge-canary"]
    args = CANARY.parse_args(c["args"])
    assert args.command == "run"
    config = CANARY.load_config(args)
    # The eval set the pod reads is the ConfigMap's file, valid for the canary's loader.
    (volume,) = [v for v in pod["volumes"] if "configMap" in v]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == volume["name"]]
    (configmap,) = find(list(rendered(name)), "ConfigMap", volume["configMap"]["name"])
    (file_name,) = configmap["data"]
    assert args.eval_set == f"{mount['mountPath']}/{file_name}"
    local = tmp_path / file_name
    local.write_text(configmap["data"][file_name])
    evalset = load_eval_set(str(local))
    assert evalset.held_out and evalset.checks
    assert yaml.safe_load(configmap["data"][file_name])["name"] == "lmforge-default"
    if name == "cpu-only":
        assert config.tolerance.max_perplexity_increase_ratio == 0.05
        assert args.api_key_file == "/var/run/secrets/lmforge/api-key/key"  # the inference keys' first key
    if name == "default":
        assert args.api_key_file is None
