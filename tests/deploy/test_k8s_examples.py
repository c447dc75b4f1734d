"""The Kubernetes examples are valid objects and run the commands the CLI really has."""

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from lmforge.dataprep.cli import CLI
from lmforge.dataprep.config import load_dataprep_config
from lmforge.dataprep.stages import GLOBAL_STAGES, ROUNDS, stage

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "k8s" / "examples").glob("*.yaml"))


def documents():
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            yield path.name, doc


@pytest.mark.parametrize("name, doc", list(documents()))
def test_example_is_a_valid_kubernetes_object(name, doc):
    kubernetes_validate.validate(doc, "1.30.0", strict=True)


def test_dataprep_jobs_run_real_cli_commands():
    jobs = {doc["metadata"]["name"]: doc for _, doc in documents() if doc["kind"] == "Job"}
    workers = jobs["lmforge-dataprep-workers"]["spec"]
    assert workers["completionMode"] == "Indexed"
    for job in jobs.values():
        for container in job["spec"]["template"]["spec"]["containers"]:
            CLI.parse_args(container["args"])  # exits (SystemExit) on an unknown command or flag
    worker_args = CLI.parse_args(workers["template"]["spec"]["containers"][0]["args"])
    assert worker_args.command == "run" and worker_args.worker_index is None  # taken from JOB_COMPLETION_INDEX
    assert worker_args.num_workers == workers["completions"]
    # Then one Job per global stage, in the declared order (one per round for the components, as
    # many as the workers' recorded components.max_rounds); the split ones share the stage's tasks.
    config = load_dataprep_config(None, worker_args.overrides)
    expected = [f"{s.name}-{r:02d}" if s.kind == ROUNDS else s.name for s in GLOBAL_STAGES
                for r in range(config.components.max_rounds if s.kind == ROUNDS else 1)]
    roles = [name.removeprefix("lmforge-dataprep-") for name in jobs if name != "lmforge-dataprep-workers"]
    assert roles == expected
    for role in roles:
        spec = jobs[f"lmforge-dataprep-{role}"]["spec"]
        args = CLI.parse_args(spec["template"]["spec"]["containers"][0]["args"])
        # a rounds stage's Job is <stage>-NN; stage names may hold dashes (trace-index)
        name, _, round_ = role.rpartition("-") if role[-2:].isdigit() else (role, "", "")
        assert args.command == name and args.output == worker_args.output
        if stage(name).split:
            assert spec["completionMode"] == "Indexed" and spec["maxFailedIndexes"] == 0
            assert args.worker_index is None and args.num_workers == spec["completions"]
            assert getattr(args, "round", None) == (int(round_) if round_ else None)
        else:
            assert "completionMode" not in spec
