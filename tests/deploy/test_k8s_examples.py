"""The Kubernetes examples are valid objects and run the commands the CLI really has."""

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from lmforge.dataprep.cli import CLI

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
    # Then one Job per global stage, in order; the Indexed ones split the stage's tasks.
    stages = [name.removeprefix("lmforge-dataprep-") for name in jobs if name != "lmforge-dataprep-workers"]
    assert stages == ["dedup", "cluster", "tokenizer", "tokenize", "shards", "report"]
    for stage in stages:
        spec = jobs[f"lmforge-dataprep-{stage}"]["spec"]
        args = CLI.parse_args(spec["template"]["spec"]["containers"][0]["args"])
        assert args.command == stage and args.output == worker_args.output
        if stage in ("dedup", "tokenize", "shards"):
            assert spec["completionMode"] == "Indexed" and spec["maxFailedIndexes"] == 0
            assert args.worker_index is None and args.num_workers == spec["completions"]
        else:
            assert "completionMode" not in spec
