"""`lmforge-train plan --schedule`: a layout search per stage of the trainer's schedule, totals that add the
stages up, one-line refusals of a bad schedule, and values the chart and the trainer take (schedule and all)."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helm_python import Chart

from lmforge.common.config import cli_overrides
from lmforge.common.errors import ConfigError
from lmforge.tooling import values_schema
from lmforge.trainer.cli import CLI
from lmforge.trainer.config import TrainConfig
from lmforge.trainer.planner.layout import AXES
from lmforge.trainer.planner.schedule_plan import plan_schedule
from lmforge.trainer.planner.schedule_render import schedule_document, schedule_table, schedule_values_yaml
from lmforge.trainer.schedule import TrainingPlan, resolve_stages
from tests.helm_chart import CHART, find, render

USD_PER_GPU_HOUR = 2.0
# Llama 3's recipe in small: 1M-token batches of 4k, then 4M of 8k, then 32k (RoPE base raised), on one node
SCHEDULE = {
    "steps": 10,  # --tokens wins over it
    "schedule": [
        {"name": "short", "start_tokens": 0, "global_batch_tokens": 2**20, "seq_len": 4096},
        {"name": "mid", "start_tokens": 20 * 10**9, "global_batch_tokens": 4 * 2**20, "seq_len": 8192},
        {"name": "long", "start_tokens": 40 * 10**9, "seq_len": 32768, "rope_theta": 8e6,
         "mixture": {"web": 1, "books": 2}},
    ],
}
CLUSTER = ["--model", "llama-8b", "--gpu", "H100", "--nodes", "1", "--gpus-per-node", "8"]


def plan_args(schedule_file: Path, *extra: str):
    return CLI.parse_args(["plan", *CLUSTER, "--schedule", str(schedule_file), *extra])


def plan_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lmforge.trainer.cli", "plan", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def schedule_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("schedule") / "schedule.yaml"
    path.write_text(yaml.safe_dump(SCHEDULE))
    return path


@pytest.fixture(scope="module")
def document(schedule_file) -> dict:
    args = plan_args(schedule_file, "--tokens", "5e10", "--usd-per-gpu-hour", str(USD_PER_GPU_HOUR))
    return schedule_document(plan_schedule(args))


def test_each_stage_gets_its_own_layout_and_the_totals_add_up(document):
    short, mid, long = document["stages"]
    for stage, seq_len, batch_tokens in ((short, 4096, 2**20), (mid, 8192, 4 * 2**20), (long, 32768, 4 * 2**20)):
        assert (stage["seq_len"], stage["global_batch_tokens"]) == (seq_len, batch_tokens)  # inherited by `long`
        assert stage["global_batch_sequences"] * seq_len == batch_tokens
        best = stage["recommended"]
        layout = best["layout"]
        assert best["fits"] and math.prod(layout[a] for a in AXES if a != "ep") == 8
        assert (layout["dp_replicate"] * layout["dp_shard"] * layout["micro_batch"] * layout["microbatches"]
                == stage["global_batch_sequences"])
        assert stage["tokens"] == stage["steps"] * batch_tokens == best["run"]["steps"] * batch_tokens
        assert stage["tokens_per_second"] == pytest.approx(batch_tokens / best["step"]["step_seconds"])
        assert best["run"]["wall_clock_days"] == pytest.approx(stage["steps"] * best["step"]["step_seconds"] / 86400)
    # the stages follow each other, each starting at the trainer's step for its start_tokens
    assert short["start_tokens"] == 0 and short["end_tokens"] == mid["start_tokens"] >= 20e9
    assert mid["end_tokens"] == long["start_tokens"] >= 40e9 and long["end_tokens"] == document["schedule"]["tokens"]
    assert long["first_step"] == mid["first_step"] + mid["steps"] and mid["first_step"] == short["steps"]
    # 32k tokens a sequence do not fit as the 4k stage runs: the long stage splits its sequences (cp) further
    assert long["recommended"]["layout"]["cp"] > short["recommended"]["layout"]["cp"]
    total, runs = document["total"], [stage["recommended"]["run"] for stage in document["stages"]]
    assert total["steps"] == sum(s["steps"] for s in document["stages"]) == document["schedule"]["steps"]
    assert total["tokens"] == document["schedule"]["tokens"] >= 5e10 > total["tokens"] - 4 * 2**20
    assert total["wall_clock_days"] == pytest.approx(sum(run["wall_clock_days"] for run in runs))
    assert total["gpu_hours"] == pytest.approx(total["wall_clock_days"] * 24 * 8)
    assert total["cost_usd"] == pytest.approx(total["gpu_hours"] * USD_PER_GPU_HOUR)


def test_the_table_has_a_block_per_stage_and_the_total(document):
    text = schedule_table(document)
    for name in ("short", "mid", "long"):
        assert f" {name}: tokens " in text
    assert text.count("  layout ") == text.count("  memory ") == text.count("  step ") == 3
    assert "redeploy at step" in text and "total " in text and "GPU-hours" in text and "$" in text


def test_the_values_are_the_chart_and_the_trainers(document, tmp_path):
    values = yaml.safe_load(schedule_values_yaml(document))
    config = values["training"]["config"]
    stages = document["stages"]
    assert [s["batch_size"] for s in config["schedule"]] == [s["recommended"]["layout"]["micro_batch"] for s in stages]
    assert config["schedule"][2]["rope_theta"] == 8e6 and config["schedule"][2]["mixture"] == {"web": 1, "books": 2}
    assert config["steps"] == document["total"]["steps"] and "grad_accum" not in config
    first = stages[0]["recommended"]["layout"]
    assert {axis: config["parallel"][axis] for axis in AXES} == {axis: first[axis] for axis in AXES}
    # Helm validates them (the chart's defaults merged in) against the schema generated from the services'
    # configs, schedule: among them (make docs writes it to the chart)
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    (chart / "values.schema.json").write_text(values_schema.render(), encoding="utf-8")
    Chart.load(chart).validate_schema(values)
    # the chart renders the trainer's command, whose schedule is the trainer config's own
    values["training"]["config"]["data"]["sources"] = [{"path": f"s3://corpus/{name}"} for name in ("web", "books")]
    values["training"]["checkpoints"] = {"persistentVolumeClaim": "lmforge-checkpoints"}
    (job,) = find(render(values, namespace="ml", chart=chart), "PyTorchJob")
    spec = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    args = next(c for c in spec["containers"] if c["name"] == "pytorch")["args"]
    overrides = [arg for arg in args[2:] if "=" in arg and not arg.startswith("-")]
    rendered = cli_overrides(overrides)  # the trainer config the chart's command gives (the chart's defaults too)
    assert rendered["schedule"] == config["schedule"] and rendered["parallel"] == config["parallel"]
    trainer = TrainConfig.model_validate(rendered)
    # the trainer places the stages as the plan did, and starts on every deployment's layout
    plan = TrainingPlan.of(trainer, first["dp_replicate"] * first["dp_shard"])
    assert [s.first_step for s in plan.stages] == [s["first_step"] for s in stages]
    assert plan.total_tokens == document["total"]["tokens"]
    assert [s.seq_len for s in resolve_stages(trainer)] == [4096, 8192, 32768]
    assert len(document["deployments"]) == 3
    # each stage carries its layout's mesh: on the first deployment's mesh the trainer runs stage 0 and stops
    # before the next stage planned for another one
    assert [s["mesh"] for s in config["schedule"]] == [{axis: s["recommended"]["layout"][axis] for axis in AXES}
                                                       for s in stages]
    on_first = TrainingPlan.of(trainer, first["dp_replicate"] * first["dp_shard"], mesh=config["schedule"][0]["mesh"])
    problems = [on_first.layout_problem(stage) for stage in on_first.stages]
    assert problems[0] is None and "is planned for" in problems[document["deployments"][1]["stage"]]
    header = [line for line in schedule_values_yaml(document).splitlines() if line.startswith("# at stage")]
    assert len(header) == 2 and "'long'" in header[1] and "world size 8" in header[1]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("- {start_tokens: 5, global_batch_tokens: 1048576, seq_len: 4096}", "schedule[0].start_tokens"),
        ("- {start_tokens: 0, global_batch_tokens: 1000, seq_len: 4096}", "is not a whole number of sequences"),
        ("- {start_tokens: 0, global_batch_tokens: 1048576, seq_len: 4096, batch: 2}", "schedule.0.batch"),
        ("schedule: []", "without a `schedule:` list"),
        ("- [not, a, stage]", "must hold a list of stages"),
        ("- {start_tokens: 0, global_batch_tokens: 1048576, seq_len: 4096}\n"
         "- {start_tokens: 60000000000000, seq_len: 8192}", "--tokens: 1e+12 tokens end before the last stage"),
        ("- {start_tokens: 0, global_batch_tokens: 3145728, seq_len: 4096}\n- {start_tokens: 1, seq_len: 6144}",
         "must divide the longest"),
        ("- {start_tokens: 0, global_batch_tokens: 1048576, seq_len: 4096", "is not valid YAML"),
    ],
)
def test_a_bad_schedule_file_is_refused_in_one_line(tmp_path, content, message):
    """A ConfigError: the CLI prints it as one line and exits 2 (the command's test below)."""
    path = tmp_path / "schedule.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError) as refused:
        plan_schedule(plan_args(path, "--tokens", "1e12"))
    assert "\n" not in str(refused.value) and message in str(refused.value), refused.value


def test_the_command_prints_the_plan_and_exits_2_in_one_line_on_a_bad_schedule(schedule_file, tmp_path):
    result = plan_cli(*CLUSTER, "--schedule", str(schedule_file), "--tokens", "5e10")
    assert result.returncode == 0, result.stderr
    assert "stage 2 long" in result.stdout and "total " in result.stdout
    stages = tmp_path / "stages.yaml"
    stages.write_text(yaml.safe_dump(SCHEDULE["schedule"]))  # a plain list: no steps to take the length from
    result = plan_cli(*CLUSTER, "--schedule", str(stages))
    assert result.returncode == 2 and "give --tokens" in result.stderr and result.stderr.strip().count("\n") == 0


def test_the_files_steps_give_the_length_without_tokens(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"steps": 9_600, "data": {"seq_len": 4096}, "schedule": [
        {"start_tokens": 0, "global_batch_tokens": 2**20}, {"start_tokens": 2**33, "seq_len": 8192}]}))
    document = schedule_document(plan_schedule(plan_args(path)))
    first, second = document["stages"]
    assert document["total"]["steps"] == first["steps"] + second["steps"] == 9_600
    assert first["steps"] == 2**13 and first["seq_len"] == 4096 and second["global_batch_tokens"] == 2**20
