"""Run a compiled KFP pipeline (the IR YAML that `make pipelines` writes) the way the Kubeflow
Pipelines backend does, each container task in its image with the container engine.

It stands in for KFP's driver and launcher, not for any of our code:
- driver: each task's inputs from the pipeline's parameters (with their defaults), upstream
  outputs and constants; a ParallelFor runs its body once per item and dsl.Collected gathers
  the body's outputs into a list; a dsl.If runs its body when its condition holds;
- launcher: the ExecutorInput (parameter values typed as the component declares them, output
  parameter files under /tmp/kfp/outputs, output artifacts with s3:// URIs under the pipeline
  root, whose files the step writes under the /s3 scratch volume, the executor output file
  /tmp/kfp_outputs/output_metadata.json), `{{$}}` in the args replaced by it, the container's
  command replacing the image's entrypoint, and the outputs read back from the executor output
  file (parameters missing there from their output files).
Uploading output artifacts to the pipeline root and ML Metadata are left out: no step of ours
reads an artifact of another.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.images.engine import RUN_FLAGS, engine

PIPELINE_ROOT = "s3://mlpipeline/v2/artifacts"  # KFP's default bucket layout (artifacts only, never uploaded here)
CASTS: dict[str, Callable[[Any], Any]] = {"NUMBER_INTEGER": int, "NUMBER_DOUBLE": float, "BOOLEAN": bool,
                                          "STRING": str, "LIST": list, "STRUCT": dict}
_CONDITION = re.compile(r"inputs\.parameter_values\['([^']+)'\] == (true|false)")


@dataclass
class StepRun:
    """One container execution: what ran, with which executor input, and what it returned."""

    task: str
    image: str
    executor_input: dict
    outputs: dict[str, Any]
    artifacts: dict[str, dict]  # name → {"uri", "metadata", "path" (on this machine)}
    seconds: float
    log: str


@dataclass
class PipelineRunner:
    """Runs `spec` (a parsed IR YAML): containers get `env`, `network` and `volumes`
    ({host path: container path}); `workdir` holds each step's KFP files; `after` maps a task
    name to a function of its outputs that returns the outputs the downstream tasks see."""

    spec: dict
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    volumes: dict[Path, str] = field(default_factory=dict)
    network: str = "none"
    extra_flags: Sequence[str] = ()
    after: dict[str, Callable[[dict], dict]] = field(default_factory=dict)
    timeout: float = 600
    run_id: str = "0c3f6a52-run-in-image"
    steps: list[StepRun] = field(default_factory=list)

    def run(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Run the pipeline with `arguments` (others take their defaults); returns its output parameters."""
        root = self.spec["root"]
        declared = root["inputDefinitions"]["parameters"]
        unknown = set(arguments) - set(declared)
        assert not unknown, f"not parameters of {self.spec['pipelineInfo']['name']}: {sorted(unknown)}"
        inputs = {name: _cast(arguments.get(name, p.get("defaultValue")), p["parameterType"])
                  for name, p in declared.items() if name in arguments or "defaultValue" in p}
        return self._dag(root, inputs)

    # ---------------------------------------------------------------- driver

    def _dag(self, component: dict, inputs: dict[str, Any]) -> dict[str, Any]:
        tasks = component["dag"]["tasks"]
        outputs: dict[str, dict[str, Any]] = {}
        for name in _in_order(tasks):
            task = tasks[name]
            values = self._task_inputs(task, inputs, outputs)
            condition = task.get("triggerPolicy", {}).get("condition")
            if condition and not _holds(condition, values):
                outputs[name] = {}
                continue
            child = self.spec["components"][task["componentRef"]["name"]]
            if "dag" in child and "parameterIterator" in task:
                iterator = task["parameterIterator"]
                items = values[iterator["items"]["inputParameter"]]
                runs = [self._dag(child, {**values, iterator["itemInput"]: item}) for item in items]
                outputs[name] = {key: [run[key] for run in runs]  # dsl.Collected
                                 for key in child.get("outputDefinitions", {}).get("parameters", {})}
            elif "dag" in child:
                outputs[name] = self._dag(child, values)
            else:
                outputs[name] = self._container(name, child, values)
            if name in self.after:
                outputs[name] = self.after[name](outputs[name])
        results = {}
        for key, source in component["dag"].get("outputs", {}).get("parameters", {}).items():
            selector = source["valueFromParameter"]
            results[key] = outputs[selector["producerSubtask"]][selector["outputParameterKey"]]
        return results

    def _task_inputs(self, task: dict, inputs: dict, outputs: dict) -> dict[str, Any]:
        values = {}
        for key, source in task.get("inputs", {}).get("parameters", {}).items():
            if "componentInputParameter" in source:
                if source["componentInputParameter"] in inputs:
                    values[key] = inputs[source["componentInputParameter"]]
            elif "taskOutputParameter" in source:
                producer = source["taskOutputParameter"]
                values[key] = outputs[producer["producerTask"]][producer["outputParameterKey"]]
            elif "runtimeValue" in source:
                constant = source["runtimeValue"]["constant"]
                values[key] = constant.replace("{{$.pipeline_job_uuid}}", self.run_id) \
                    if isinstance(constant, str) else constant
            else:
                raise AssertionError(f"input {key}: unsupported source {source}")
        return values

    # ---------------------------------------------------------------- launcher

    def _container(self, task: str, component: dict, values: dict[str, Any]) -> dict[str, Any]:
        container = self.spec["deploymentSpec"]["executors"][component["executorLabel"]]["container"]
        step_dir = self.workdir / f"{len(self.steps):02d}-{task}"
        mounts = {step_dir / "kfp": "/tmp/kfp", step_dir / "kfp_outputs": "/tmp/kfp_outputs",
                  step_dir / "s3": "/s3", **self.volumes}
        for host in mounts:
            host.mkdir(parents=True, exist_ok=True)
            host.chmod(0o777)  # the image's user (uid 10001) writes here
        executor_input = self._executor_input(task, component, values)
        replaced = [arg.replace("{{$}}", json.dumps(executor_input)) for arg in container.get("args", [])]
        command = container["command"]
        leftover = [a for a in [*command, *replaced] if "{{$" in a]
        assert not leftover, f"{task}: placeholders this runner does not fill: {leftover}"
        flags = [*RUN_FLAGS, "--rm", "--network", self.network, "--read-only", "--tmpfs", "/tmp",
                 *self.extra_flags, "--entrypoint", command[0]]
        for host, path in mounts.items():
            flags += ["--volume", f"{host}:{path}"]
        for key, value in self.env.items():
            flags += ["--env", f"{key}={value}"]
        started = time.monotonic()
        result = engine("run", *flags, container["image"], *command[1:], *replaced, timeout=self.timeout,
                        check=False)
        log = result.stdout + result.stderr
        assert result.returncode == 0, f"step {task} ({container['image']}) exited {result.returncode}:\n{log[-8000:]}"
        output = json.loads((step_dir / "kfp_outputs" / "output_metadata.json").read_text())
        outputs = dict(output.get("parameterValues", {}))
        for name, spec in component.get("outputDefinitions", {}).get("parameters", {}).items():
            if name not in outputs:
                file = step_dir / "kfp" / "outputs" / name
                text = file.read_text()
                outputs[name] = text if spec["parameterType"] == "STRING" else json.loads(text)
        artifacts = {}
        for name, listing in executor_input["outputs"].get("artifacts", {}).items():
            produced = output.get("artifacts", {}).get(name, listing)["artifacts"][0]
            uri = produced["uri"]
            artifacts[name] = {"uri": uri, "metadata": produced.get("metadata", {}),
                               "path": step_dir / "s3" / uri.removeprefix("s3://")}
        self.steps.append(StepRun(task, container["image"], executor_input, outputs, artifacts,
                                  time.monotonic() - started, log))
        return outputs

    def _executor_input(self, task: str, component: dict, values: dict[str, Any]) -> dict:
        declared = component.get("inputDefinitions", {}).get("parameters", {})
        parameter_values = {}
        for name, spec in declared.items():
            if name in values:
                parameter_values[name] = _cast(values[name], spec["parameterType"])
            elif "defaultValue" in spec:
                parameter_values[name] = _cast(spec["defaultValue"], spec["parameterType"])
            else:
                assert spec.get("isOptional"), f"{task}: no value for its input {name}"
        outputs_spec = component.get("outputDefinitions", {})
        prefix = f"{PIPELINE_ROOT}/{self.spec['pipelineInfo']['name']}/{self.run_id}/{task}/{len(self.steps)}"
        return {
            "inputs": {"parameterValues": parameter_values},
            "outputs": {
                "parameters": {name: {"outputFile": f"/tmp/kfp/outputs/{name}"}
                               for name in outputs_spec.get("parameters", {})},
                "artifacts": {name: {"artifacts": [{"name": name, "type": spec["artifactType"],
                                                    "uri": f"{prefix}/{name}", "metadata": {}}]}
                              for name, spec in outputs_spec.get("artifacts", {}).items()},
                "outputFile": "/tmp/kfp_outputs/output_metadata.json",
            },
        }


def _cast(value: Any, parameter_type: str) -> Any:
    """A value as the executor input carries one of `parameter_type` (the IR's numbers are floats)."""
    if parameter_type == "NUMBER_INTEGER" and isinstance(value, float):
        assert value.is_integer(), value
    return CASTS[parameter_type](value)


def _holds(condition: str, values: dict[str, Any]) -> bool:
    match = _CONDITION.fullmatch(condition)
    assert match, f"condition {condition!r}: this runner knows `inputs.parameter_values['X'] == true|false`"
    return values[match.group(1)] is (match.group(2) == "true")


def _in_order(tasks: dict[str, dict]) -> list[str]:
    """The DAG's tasks, each after those it depends on (dependentTasks and the producers of its inputs)."""
    def needs(task: dict) -> set[str]:
        producers = {source["taskOutputParameter"]["producerTask"]
                     for source in task.get("inputs", {}).get("parameters", {}).values()
                     if "taskOutputParameter" in source}
        return set(task.get("dependentTasks", [])) | producers

    order: list[str] = []
    while len(order) < len(tasks):
        ready = [name for name in sorted(tasks) if name not in order and needs(tasks[name]) <= set(order)]
        assert ready, f"the DAG has a cycle among {sorted(set(tasks) - set(order))}"
        order.extend(ready)
    return order
