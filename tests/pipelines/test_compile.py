"""The compiled pipelines are valid KFP IR (PipelineSpec) with the parameters users set in the UI."""

from __future__ import annotations

import pytest
import yaml
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from lmforge.dataprep.stages import DEFAULT_MAX_ROUNDS, GLOBAL_STAGES, ROUNDS
from lmforge_pipelines import compile as compile_module
from lmforge_pipelines.images import DATAPREP_IMAGE, IMAGE_REGISTRY, IMAGE_TAG, TRAINER_IMAGE, image

DATA_UI = {"crawl": ("STRING", "sample"), "shards": ("NUMBER_INTEGER", 2), "languages": ("STRING", "en"),
           "workers": ("NUMBER_INTEGER", 2), "output": ("STRING", "s3://lmforge/datasets/sample"),
           # the chart's dataprep.stages defaults
           "stage_tasks": ("STRUCT", {s.name: 8 for s in GLOBAL_STAGES if s.split}),
           "processes_per_task": ("NUMBER_INTEGER", 1),
           "dataprep_config": ("STRUCT", {})}
TRAIN_UI = {"data": ("STRING", "s3://lmforge/datasets/sample"), "model_preset": ("STRING", "tiny"),
            "steps": ("NUMBER_INTEGER", 1000), "nodes": ("NUMBER_INTEGER", 1), "gpus_per_node": ("NUMBER_INTEGER", 1),
            "launcher": ("STRING", "pytorchjob"), "namespace": ("STRING", "lmforge"),
            "release": ("STRING", "lmforge"),
            "chart_values": ("STRUCT", {"image": {"registry": IMAGE_REGISTRY, "tag": IMAGE_TAG}}),
            "checkpoint_store": ("STRING", "s3://lmforge/runs"), "rollout": ("BOOLEAN", False),
            "deployment": ("STRING", "lmforge-inference"), "train_config": ("STRUCT", {}),
            "model_pointer": ("STRING", "s3://lmforge/models/current"),
            "canary_cronjob": ("STRING", "lmforge-canary"), "rollback_on_canary_failure": ("BOOLEAN", True)}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipelines")
    assert compile_module.main(["--output", str(out)]) == 0
    specs = {}
    for name in ("data", "train"):
        docs = [d for d in yaml.safe_load_all((out / f"{name}.yaml").read_text()) if d]
        assert len(docs) == 1, "no platform spec expected (no kfp-kubernetes settings)"
        spec = pipeline_spec_pb2.PipelineSpec()
        json_format.ParseDict(docs[0], spec)  # strict: an unknown or mistyped field raises
        specs[name] = (docs[0], spec)
    return specs


def _root_parameters(spec: pipeline_spec_pb2.PipelineSpec) -> dict:
    params = spec.root.input_definitions.parameters
    types = pipeline_spec_pb2.ParameterType.ParameterTypeEnum
    return {name: (types.Name(p.parameter_type), json_format.MessageToDict(p.default_value) if p.HasField(
        "default_value") else None, p.description) for name, p in params.items()}


@pytest.mark.parametrize(("name", "ui", "pipeline_name"),
                         [("data", DATA_UI, "lmforge-data"), ("train", TRAIN_UI, "lmforge-train")])
def test_pipeline_spec_is_valid_ir_with_the_ui_parameters(compiled, name, ui, pipeline_name):
    raw, spec = compiled[name]
    assert spec.pipeline_info.name == pipeline_name
    assert spec.schema_version == "2.1.0" and spec.sdk_version == "kfp-2.17.0"
    params = _root_parameters(spec)
    for param, (kind, default) in ui.items():
        assert param in params, f"{param} missing from the {name} pipeline's inputs"
        assert params[param][:2] == (kind, default), param
        assert params[param][2], f"{param} has no description for the UI"
    # Every task refers to a component that exists, and every component to an executor.
    executors = raw["deploymentSpec"]["executors"]
    for component in raw["components"].values():
        if "executorLabel" in component:
            assert component["executorLabel"] in executors
    for task in list(raw["root"]["dag"]["tasks"].values()):
        assert task["componentRef"]["name"] in raw["components"]


def _constant(task, name: str):
    value = task.inputs.parameters[name].runtime_value.constant
    return value.string_value if value.WhichOneof("kind") == "string_value" else int(value.number_value)


def test_data_pipeline_is_built_from_the_declared_stages(compiled):
    """After the workers' loop, the steps follow lmforge.dataprep.stages: a plan step and a
    ParallelFor per split stage (per round for the components), a step per single stage, then the
    report; each waits for the one before (fanned in after a loop)."""
    raw, spec = compiled["data"]
    tasks = spec.root.dag.tasks
    chain, name = [], "report-data"
    while name != "plan-workers":
        chain.append(name)
        (name,) = tasks[name].dependent_tasks
    chain.reverse()
    assert chain[0] == "for-loop-1"
    workers = tasks["for-loop-1"]
    (inner,) = spec.components[workers.component_ref.name].dag.tasks.values()
    assert inner.component_ref.name == "comp-prep-worker"
    assert inner.inputs.parameters["num_workers"].component_input_parameter == "pipelinechannel--workers"
    steps, position = [], 1
    while position < len(chain) - 1:
        step = tasks[chain[position]]
        if step.component_ref.name.startswith("comp-plan-tasks"):
            loop = tasks[chain[position + 1]]
            assert loop.WhichOneof("iterator") == "parameter_iterator"
            assert loop.parameter_iterator.items.input_parameter == f"pipelinechannel--{chain[position]}-Output"
            (inner,) = spec.components[loop.component_ref.name].dag.tasks.values()
            assert inner.component_ref.name.startswith("comp-stage-task")
            assert inner.inputs.parameters["stage_tasks"].component_input_parameter == "pipelinechannel--stage_tasks"
            steps.append((_constant(step, "stage"), _constant(step, "round")))
            position += 2
        else:
            assert step.component_ref.name.startswith("comp-single-stage")
            steps.append((_constant(step, "stage"), None))
            position += 1
    expected = [(s.name, r if s.split else None) for s in GLOBAL_STAGES if s.name != "report"
                for r in range(DEFAULT_MAX_ROUNDS if s.kind == ROUNDS else 1)]
    assert steps == expected
    # A step after a loop takes its tasks' outputs fanned in (dsl.Collected), so it runs after all of them.
    for before, after in zip(chain, chain[1:]):
        if before.startswith("for-loop"):
            assert tasks[after].inputs.parameters["done"].task_output_parameter.producer_task == before
    # No task output hides in a constant as a placeholder (a list holding one): not every runner resolves those.
    assert "{{$.inputs.parameters" not in str(raw["root"]["dag"])
    outputs = raw["components"]["comp-report-data"]["outputDefinitions"]["artifacts"]
    assert outputs["report"]["artifactType"]["schemaTitle"] == "system.HTML"
    assert outputs["dataset"]["artifactType"]["schemaTitle"] == "system.Dataset"
    assert set(raw["root"]["outputDefinitions"]["artifacts"]) == {"dataset", "report"}
    for executor in raw["deploymentSpec"]["executors"].values():
        assert executor["container"]["image"] == DATAPREP_IMAGE
        assert "pip install" not in " ".join(executor["container"]["command"])  # kfp comes with the image
    # A global-stage task asks for what the chart's stage pods ask for (one CPU, 2 GiB).
    for name, executor in raw["deploymentSpec"]["executors"].items():
        if name.startswith(("exec-stage-task", "exec-single-stage")):
            resources = executor["container"]["resources"]
            assert (resources["resourceCpuRequest"], resources["resourceMemoryLimit"]) == ("1", "2Gi"), name


def test_train_pipeline_chain_and_conditional_rollout(compiled):
    raw, spec = compiled["train"]
    tasks = spec.root.dag.tasks
    assert set(tasks) == {"train-model", "export-model", "evaluate-model", "condition-1"}
    assert list(tasks["export-model"].dependent_tasks) == ["train-model"]
    assert list(tasks["evaluate-model"].dependent_tasks) == ["export-model"]
    condition = tasks["condition-1"]
    assert condition.trigger_policy.condition == "inputs.parameter_values['pipelinechannel--rollout'] == true"
    inner = spec.components[condition.component_ref.name].dag.tasks
    assert set(inner) == {"rollout-model"}
    # The run name defaults to the pipeline run's id, which KFP substitutes at run time.
    job_id = tasks["train-model"].inputs.parameters["job_id"].runtime_value.constant.string_value
    assert job_id == "{{$.pipeline_job_uuid}}"
    metrics = raw["components"]["comp-evaluate-model"]["outputDefinitions"]["artifacts"]["metrics"]
    assert metrics["artifactType"]["schemaTitle"] == "system.Metrics"
    for executor in raw["deploymentSpec"]["executors"].values():
        assert executor["container"]["image"] == TRAINER_IMAGE
    # With evaluation branches the export step publishes the best evaluated checkpoint (evals/best.json).
    export = raw["deploymentSpec"]["executors"]["exec-export-model"]["container"]
    assert "bodies.export_run_model(" in export["command"][-1]


def test_image_names_follow_the_chart():
    assert image("dataprep") == "lmforge/dataprep:0.1.0"
    assert image("trainer", registry="ghcr.io/acme/", tag="1.2.3") == "ghcr.io/acme/lmforge/trainer:1.2.3"
