"""The stage graph is declared once (lmforge.dataprep.stages): the stage runs, the CLI, the timings and
the config are built from it or agree with it. The chart, the plain-manifest example and the KFP
pipeline are checked against it in tests/deploy and tests/pipelines."""

from __future__ import annotations

import argparse

import pytest

from lmforge.dataprep import stage_runs, stages, timings
from lmforge.dataprep.cli import CLI
from lmforge.dataprep.config import ComponentsConfig


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in CLI.parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_the_runner_has_one_function_per_declared_stage_in_order():
    assert list(stage_runs.STAGE_RUNS) == list(stages.NAMES)
    assert stages.NAMES[0] == "inputs" and stages.STAGES[0].kind == stages.WORKERS
    assert [s.name for s in stages.GLOBAL_STAGES] == list(stages.NAMES[1:])


def test_every_global_stage_is_a_cli_command_with_the_options_of_its_kind():
    commands = _subcommands()
    for stage in stages.GLOBAL_STAGES:
        assert stage.name in commands, stage.name
        options = {o for a in commands[stage.name]._actions for o in a.option_strings}
        assert ("--num-workers" in options) == stage.split, stage.name
        assert ("--round" in options) == (stage.kind == stages.ROUNDS), stage.name
        assert commands[stage.name].description or stage.help
    assert "cluster" not in commands  # replaced by the components rounds


def test_timed_phases_and_config_defaults_follow_the_declaration():
    assert list(timings.PHASES) == list(stages.NAMES)
    assert ComponentsConfig().max_rounds == stages.DEFAULT_MAX_ROUNDS
    assert stages.stage("dedup").split and not stages.stage("tokenizer").split
    with pytest.raises(KeyError, match="'cluster' is not a data-prep stage"):
        stages.stage("cluster")


def test_a_components_slice_without_a_round_is_refused(tmp_path, capsys):
    # One Indexed Job per round: a pod's slice is of one round's tasks.
    code = CLI.main(["components", "--output", str(tmp_path), "--worker-index", "0", "--num-workers", "2"])
    assert code == 2
    assert "give --round" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
